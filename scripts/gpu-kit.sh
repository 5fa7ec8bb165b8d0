#!/usr/bin/env bash
# The GPU kit (docs/gpu-kit.md): Ferry and Triton alone side by side on a GPU machine.
#
#   scripts/gpu-kit.sh build          here (no GPU): pack into .gpu-kit/ what the GPU machine
#                                     lacks (tritonserver and its Python backend for 3.12,
#                                     perf_analyzer, redis-server and redis-cli, Ferry's Python 3.12
#                                     wheels);
#                                     Ferry itself travels as the repository
#   scripts/gpu-kit.sh run [--out D] [python -m loadtest.gpukit run's options]
#                                     there: unpack into /tmp/ferry-kit, start Redis, Triton and
#                                     Ferry, measure, write D/gpu-kit.{json,md} and D/logs.txt
#   scripts/gpu-kit.sh run --cpu      the dry run on this machine (the tiny numpy model, the
#                                     installed venv, .tools/ and Debian's redis-server)
#   scripts/gpu-kit.sh run --cpu --from-kit
#                                     the dry run from the packed kit, with whatever python3
#                                     3.12 is first on PATH (a rehearsal of the GPU run)
#
# The GPU machine: python3 3.12 with torch and torchvision, no internet; what travels with a
# command is at most 64 MiB (the repository plus .gpu-kit/), which `build` checks.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${FERRY_KIT_DIR:-.gpu-kit}  # where build packs and run unpacks from
LIMIT_MIB=64
PY_VERSION=3.12
STUB_NUMPY=numpy==1.26.4  # the version Ferry's own lock pins

die() { echo "gpu-kit: $*" >&2; exit 1; }

# -- build ----------------------------------------------------------------------------------------

build_triton() {  # tritonserver, the Python backend and its 3.12 stub, the wheel's libraries
  local site stage
  site=$(.venv/bin/python -c 'import pytriton, os; print(os.path.dirname(os.path.dirname(pytriton.__file__)))')
  stage=$(mktemp -d)
  mkdir -p "$stage/pytriton/tritonserver/python_backend_stubs" "$stage/nvidia_pytriton.libs"
  : > "$stage/pytriton/__init__.py"  # only so that Ferry finds the folder (find_spec)
  cp -a "$site/pytriton/tritonserver/bin" "$site/pytriton/tritonserver/backends" \
    "$site/pytriton/tritonserver/caches" "$stage/pytriton/tritonserver/"
  rm -rf "$stage/pytriton/tritonserver/backends/python/__pycache__"
  cp -a "$site/pytriton/tritonserver/python_backend_stubs/$PY_VERSION" \
    "$stage/pytriton/tritonserver/python_backend_stubs/"
  # every bundled library but libpython 3.13 (the 3.13 stub's; 3.12's comes from the machine)
  find "$site/nvidia_pytriton.libs" -maxdepth 1 -type f ! -name 'libpython3-*' \
    -exec cp -a {} "$stage/nvidia_pytriton.libs/" \;
  tar -C "$stage" -cf - pytriton nvidia_pytriton.libs | xz -T0 -6 > "$KIT/triton.tar.xz"
  rm -rf "$stage"
}

build_tools() {  # perf_analyzer, redis-server and redis-cli (a Redis Cluster's creation), each
  # with the libraries a bare machine lacks
  local stage lib
  [ -x .tools/perf_analyzer/perf_analyzer ] || scripts/install-perf-analyzer.sh
  stage=$(mktemp -d)
  mkdir -p "$stage/perf_analyzer/lib" "$stage/redis/bin" "$stage/redis/lib"
  cp -a .tools/perf_analyzer/perf_analyzer "$stage/perf_analyzer/"
  cp -a .tools/perf_analyzer/lib/. "$stage/perf_analyzer/lib/"
  cp -L "$(ldconfig -p | awk '/libb64\.so\.0d/ {print $NF; exit}')" "$stage/perf_analyzer/lib/"
  cp -L "$(command -v redis-server)" "$stage/redis/bin/redis-server"
  cp -L "$(command -v redis-cli)" "$stage/redis/bin/redis-cli"
  # redis-server's own libraries that an Ubuntu image seldom has (its other ones, OpenSSL,
  # systemd's, libstdc++, compression, every image has); `run` uses one only where the machine
  # has none of that name
  for lib in $(ldd "$(command -v redis-server)" | awk '/=> \// {print $3}'); do
    case "$(basename "$lib")" in
      liblzf.so.*|libjemalloc.so.*|libatomic.so.*) cp -L "$lib" "$stage/redis/lib/" ;;
    esac
  done
  tar -C "$stage" -cf - perf_analyzer redis | xz -T0 -6 > "$KIT/tools.tar.xz"
  rm -rf "$stage"
}

build_wheels() {  # Ferry's dependencies that the machine lacks, for Python 3.12, installed
  # into a folder here and packed with xz (a third smaller than the wheels' own zip)
  local stage
  stage=$(mktemp -d)
  PYTHONPATH=".:services" .venv/bin/python -m loadtest.gpukit.wheels > "$KIT/requirements.txt"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-compile \
    --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --target "$stage/site" -r "$KIT/requirements.txt" 2>&1 \
    | grep -v "is ignored: it is neither" >&2 || true
  [ -d "$stage/site/fastapi" ] || die "the wheels for Python $PY_VERSION did not install"
  # numpy 1.x (Ferry's own pin) for the kit's venv: the Python backend stub of the
  # nvidia-pytriton wheel reads BYTES inputs wrongly under numpy 2 (the machine's; a rehearsal
  # with Python 3.12 and numpy 2 here found it)
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-compile \
    --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --target "$stage/stubsite" "$STUB_NUMPY" 2>&1 | grep -v "is ignored: it is neither" >&2 || true
  [ -d "$stage/stubsite/numpy" ] || die "$STUB_NUMPY for Python $PY_VERSION did not install"
  rm -rf "$stage/stubsite/bin" "$stage/stubsite/numpy/f2py" "$stage/stubsite/numpy/doc"
  find "$stage/site" "$stage/stubsite" \( -name __pycache__ -o -name tests \) -prune \
    -exec rm -rf {} +
  tar -C "$stage" -cf - site stubsite | xz -T0 -6 > "$KIT/site.tar.xz"
  rm -rf "$stage"
}

build() {
  [ -x .venv/bin/python ] || make install
  rm -rf "$KIT" && mkdir -p "$KIT"
  build_triton
  build_tools
  build_wheels
  local kit tree
  kit=$(du -sb "$KIT" | cut -f1)
  tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
  printf 'gpu-kit: %s (%d MiB) + the repository (%d MiB) = %d MiB of %d\n' "$KIT" \
    $((kit >> 20)) $((tree >> 20)) $(((kit + tree) >> 20)) "$LIMIT_MIB"
  [ $((kit + tree)) -le $((LIMIT_MIB << 20)) ] || die "over the ${LIMIT_MIB} MiB that travel"
}

# -- run ------------------------------------------------------------------------------------------

find_libpython() {  # the folder holding libpython3.12.so.1.0 for the Python backend's stub
  local libdir found
  libdir=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
  if [ -e "$libdir/libpython$PY_VERSION.so.1.0" ]; then echo "$libdir"; return; fi
  found=$(find / -xdev -name "libpython$PY_VERSION.so.1.0" 2>/dev/null | head -1 || true)
  [ -n "$found" ] && dirname "$found"
}

unpack() {  # into $WORK: site/ (Ferry's dependencies, pytriton), venv/, perf_analyzer/, redis/
  local lib packages
  [ -f "$KIT/triton.tar.xz" ] || die "no $KIT/triton.tar.xz: run 'scripts/gpu-kit.sh build' here"
  rm -rf "$WORK" && mkdir -p "$WORK/redis/runtime"
  xz -dc "$KIT/site.tar.xz" | tar -C "$WORK" -xf -
  xz -dc "$KIT/triton.tar.xz" | tar -C "$WORK/site" -xf -
  xz -dc "$KIT/tools.tar.xz" | tar -C "$WORK" -xf -
  # A venv of the machine's python3 whose own site-packages hold numpy 1.x and then, through a
  # .pth file, the machine's packages (PyTorch): the kit runs in it, and Triton's model
  # processes find it first on PATH, as the stub's interpreter ignores PYTHONPATH.
  python3 -m venv --without-pip "$WORK/venv"
  packages=$("$WORK/venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  cp -a "$WORK"/stubsite/. "$packages/"
  python3 -c 'import site; print("\n".join(site.getsitepackages()))' > "$packages/machine.pth"
  for lib in "$WORK"/redis/lib/*; do  # only what the machine lacks
    ldconfig -p | grep -q "/$(basename "$lib")\$" || ln -s "$lib" "$WORK/redis/runtime/"
  done
  mkdir -p "$WORK/bin"
  for tool in redis-server redis-cli; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$WORK/redis/runtime" \
      "$WORK/redis/bin/$tool" > "$WORK/bin/$tool"
  done
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$WORK/perf_analyzer/lib" \
    "$WORK/perf_analyzer/perf_analyzer" > "$WORK/bin/perf_analyzer"
  chmod +x "$WORK/bin/redis-server" "$WORK/bin/redis-cli" "$WORK/bin/perf_analyzer"
}

run() {
  local cpu=0 from_kit=0 arg libdir args=()
  for arg in "$@"; do
    case "$arg" in
      --cpu) cpu=1; args+=("$arg") ;;
      --from-kit) from_kit=1 ;;
      *) args+=("$arg") ;;
    esac
  done
  if [ "$cpu" = 1 ] && [ "$from_kit" = 0 ]; then  # this machine's own installs
    make -s install .tools/perf_analyzer/.installed >/dev/null
    PYTHONPATH=".:services" exec .venv/bin/python -m loadtest.gpukit run "${args[@]}"
  fi
  WORK=${FERRY_KIT_WORK:-/tmp/ferry-kit}
  libdir=$(find_libpython) || true
  [ -n "$libdir" ] || die "no libpython$PY_VERSION.so.1.0 on this machine: Triton's Python \
backend stub for $PY_VERSION links it, and no registry this kit can reach carries one"
  export FERRY_KIT_LIBPYTHON="$libdir/libpython$PY_VERSION.so.1.0"
  unpack
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$WORK/bin:$PATH" PYTHONPATH="$WORK/site:.:services" PYTHONUNBUFFERED=1
  export FERRY_PERF_ANALYZER="$WORK/bin/perf_analyzer"
  exec "$WORK/venv/bin/python3" -m loadtest.gpukit run --work "$WORK/run" "${args[@]}"
}

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  *) echo "usage: scripts/gpu-kit.sh build | run [--cpu] --out DIR [options]" >&2; exit 2 ;;
esac
