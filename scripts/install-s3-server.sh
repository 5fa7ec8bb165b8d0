#!/usr/bin/env bash
# An S3-compatible server for the job store's tests, into .tools/s3 (idempotent): moto's server
# (S3 only), in a virtual environment of its own, so that botocore's pins (python-dateutil < 3)
# never meet Ferry's (the kubernetes client wants >= 3).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.tools/s3/venv
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/moto_server" ]; then
  PYTHON=$PYTHON scripts/venv-install.sh "$VENV" "moto[s3]==5.2.5" "flask==3.1.3" "flask-cors==6.0.5"
fi
"$VENV/bin/moto_server" --help >/dev/null
