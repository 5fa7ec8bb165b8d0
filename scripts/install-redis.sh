#!/usr/bin/env bash
# Install redis-server from Debian/Ubuntu packages when it is missing (needs root or sudo).
set -euo pipefail
command -v redis-server >/dev/null 2>&1 && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
  echo "redis-server is missing and this user cannot install it: apt-get install redis-server" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq redis-server >/dev/null
# Debian starts a system-wide instance on 6379; Ferry starts its own, so that one is not needed.
command -v redis-server >/dev/null
