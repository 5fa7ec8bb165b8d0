#!/usr/bin/env bash
# Install redis-server and redis-sentinel from Debian/Ubuntu packages when either is missing (needs
# root or sudo): the failover tests run a master, its replicas and three sentinels on loopback.
set -euo pipefail
command -v redis-server >/dev/null 2>&1 && command -v redis-sentinel >/dev/null 2>&1 && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
  echo "redis-server or redis-sentinel is missing and this user cannot install them:" \
    "apt-get install redis-server redis-sentinel" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# make test installs its tools in parallel: one apt at a time (flock, util-linux).
$SUDO flock /var/lock/ferry-apt.lock sh -c \
  'apt-get update -qq && apt-get install -y -qq redis-server redis-sentinel >/dev/null'
# Debian starts system-wide instances (6379, 26379); Ferry starts its own, so those are not needed.
if command -v systemctl >/dev/null 2>&1; then
  $SUDO systemctl disable --now redis-server redis-sentinel >/dev/null 2>&1 || true
fi
command -v redis-server >/dev/null && command -v redis-sentinel >/dev/null
