#!/usr/bin/env bash
# perf_analyzer, Triton's own C++ load generator, into .tools/ (idempotent):
#   .tools/perf_analyzer/perf_analyzer  the binary, from the tritonclient 2.41.0 manylinux wheel
#                                       (the last release whose wheel ships it)
#   .tools/perf_analyzer/lib/           libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel
#                                       (the client links it; no GPU is needed to run it)
#   .tools/bin/perf_analyzer            a wrapper that sets LD_LIBRARY_PATH and runs the binary
#                                       (.tools/bin/perf_analyzer --version: 2.41.0)
# libb64.so.0d comes from Debian's libb64-0d (installed when missing; needs root or sudo).
# Nothing here touches Ferry's own virtual environment: the wheels are only unzipped.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=.tools
HOME_DIR=$TOOLS/perf_analyzer
TRITONCLIENT=tritonclient==2.41.0
CUDA_RUNTIME=nvidia-cuda-runtime-cu12==12.9.79
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] && PYTHON=.venv/bin/python

wheel() {  # wheel REQUIREMENT PLATFORM DIR: download one binary wheel, no dependencies
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform "$2" --python-version 3.11 --dest "$3" "$1" 2>&1 | grep -v "is ignored" >&2 || true
  ls "$3"/*.whl >/dev/null
}

if ! ldconfig -p | grep -q 'libb64\.so\.0d'; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "libb64.so.0d is missing and this user cannot install it: apt-get install libb64-0d" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO flock /var/lock/ferry-apt.lock sh -c \
    'apt-get update -qq && apt-get install -y -qq libb64-0d unzip >/dev/null'
fi

if [ ! -x "$HOME_DIR/perf_analyzer" ] || [ ! -e "$HOME_DIR/lib/libcudart.so.12" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  wheel "$TRITONCLIENT" manylinux1_x86_64 "$work/client"
  wheel "$CUDA_RUNTIME" manylinux2014_x86_64 "$work/cuda"
  unzip -q -o "$work"/client/*.whl 'tritonclient-*.data/data/bin/perf_analyzer' -d "$work/client"
  unzip -q -o "$work"/cuda/*.whl 'nvidia/cuda_runtime/lib/libcudart.so.12' -d "$work/cuda"
  mkdir -p "$HOME_DIR/lib"
  install -m 0644 "$work/cuda/nvidia/cuda_runtime/lib/libcudart.so.12" "$HOME_DIR/lib/"
  install -m 0755 "$work"/client/tritonclient-*.data/data/bin/perf_analyzer "$HOME_DIR/"
fi

mkdir -p "$TOOLS/bin"
cat > "$TOOLS/bin/perf_analyzer" <<'EOF'
#!/usr/bin/env bash
# perf_analyzer with the libraries installed beside it (scripts/install-perf-analyzer.sh).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../perf_analyzer" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$here/perf_analyzer" "$@"
EOF
chmod 0755 "$TOOLS/bin/perf_analyzer"
# --version exits 0 once the binary and every library it links are found (--help exits 99).
"$TOOLS/bin/perf_analyzer" --version >/dev/null 2>&1 || {
  echo "perf_analyzer was installed but does not run:" >&2
  "$TOOLS/bin/perf_analyzer" --version 2>&1 | head -5 >&2
  exit 1
}
