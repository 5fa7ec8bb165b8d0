#!/usr/bin/env bash
# Debian's Chromium for the test that renders /docs headless with no network (tests/integration/
# test_docs_page.py): no browser build is downloaded, the distribution's package is installed
# (needs root or sudo) when it is missing.
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
  echo "chromium is missing and this user cannot install it: apt-get install chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# make test installs its tools in parallel: one apt at a time (flock, util-linux).
$SUDO flock /var/lock/ferry-apt.lock sh -c \
  'apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null'
command -v chromium >/dev/null
