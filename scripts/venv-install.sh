#!/usr/bin/env bash
# venv-install.sh VENV ARGS...: make the virtual environment VENV if it is missing, then install
# ARGS (pip's own: -r FILE, -e DIR, --no-deps, packages) into it with uv, a pinned release that
# pip installs first: uv installs Ferry's ~140 pinned packages in seconds where pip took over two
# minutes of every fresh clone's `make test`. Where uv cannot be had, pip does it.
set -euo pipefail
VENV=$1
shift
PYTHON=${PYTHON:-python3}
UV=uv==0.13.9
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
quiet() { grep -v "is ignored: it is neither" >&2 || true; }  # this machine's pip notes
if [ -x "$VENV/bin/uv" ] || "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "$UV" 2> >(quiet); then
  exec "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" "$@"
fi
echo "uv could not be installed; installing with pip" >&2
exec "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"
