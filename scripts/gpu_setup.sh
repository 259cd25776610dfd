#!/usr/bin/env bash
# Makes a lent GPU machine (torch with CUDA, no DeepSpeed, no network) able to run scripts/gpu_check.sh, from files
# carried with the working tree in .gpu/ (ignored by git; see docs/gpu_check.md).
#   bash scripts/gpu_setup.sh --prepare   # here, with network: wheels (cp312) and libaio's .deb files into .gpu/
#   source scripts/gpu_setup.sh           # there: installs into /tmp/site, unpacks libaio, builds the arena and
#                                         # DeepSpeed's ops (logs in $GPU_SETUP_LOGS, default /tmp/gpu-setup), and
#                                         # exports PYTHONPATH, CFLAGS/LDFLAGS and the library paths for the JIT builds
# Sourced, it returns 1 (and says what failed) rather than exiting the caller's shell. (libaio's package is libaio1
# on Debian 12, where --prepare has run; on Ubuntu 24.04 it is libaio1t64.)
_tc_root=$(CDPATH= cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_tc_carry=$_tc_root/.gpu

if [ "${1:-}" = "--prepare" ]; then
  if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    echo "gpu_setup: --prepare is run, not sourced: bash scripts/gpu_setup.sh --prepare" >&2
    return 1
  fi
  set -euo pipefail
  mkdir -p "$_tc_carry/whl" "$_tc_carry/deb"
  grep -qx "/.gpu/" "$_tc_root/.git/info/exclude" 2>/dev/null || echo "/.gpu/" >> "$_tc_root/.git/info/exclude"
  # pydantic-core is the one compiled wheel; the GPU machines lent so far run Python 3.12.
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 \
    -d "$_tc_carry/whl" "pydantic==$(python3 -c 'import pydantic; print(pydantic.VERSION)')" \
    "pydantic-core==$(python3 -c 'import pydantic_core; print(pydantic_core.__version__)')" \
    annotated-types typing-inspection hjson py-spy==0.4.0  # py-spy: scripts/gpu_lease.sh's profiles
  # DeepSpeed is published as an sdist only: a pure-Python wheel without prebuilt ops (they are JIT-built there).
  # Built without isolation (its setup.py imports torch), so setuptools' bdist_wheel needs `wheel` here: a fresh
  # machine's Python lacks it ("invalid command 'bdist_wheel'").
  python3 -c "import wheel" 2>/dev/null || python3 -m pip install -q wheel
  python3 -m pip download -q --no-deps --no-binary=:all: -d /tmp/gpu-setup-sdist deepspeed==0.19.8
  DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation -w "$_tc_carry/whl" \
    /tmp/gpu-setup-sdist/deepspeed-0.19.8.tar.gz
  (cd "$_tc_carry/deb" && apt-get download libaio1 libaio-dev)
  ls -la "$_tc_carry"/whl "$_tc_carry"/deb
  # The device tool sends the tracked files, the untracked ones git does not ignore and the carried .gpu/, at most
  # 64 MiB: docs/ alone passed that in the ninth lease (its validation records, plain then), and the call was refused.
  # docs/ keeps its records gzipped since (scripts/archive_records.py; tests/test_records.py checks it); the runs need
  # none of docs/validate.
  mib=$( (cd "$_tc_root" && git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null
          du -sb "$_tc_carry" | cut -f1) |
        awk '{s += $1} END {printf "%d", s / 1048576}')
  echo "gpu_setup: the working tree and .gpu/ come to $mib MiB (the device tool sends at most 64)"
  if [ "$mib" -gt 60 ]; then
    echo "gpu_setup: archive the records (python scripts/archive_records.py docs); if it is still above 60 MiB," \
         "move docs/validate aside for the call, and back after it:" \
         "mv docs/validate /tmp/tc-docs-validate ... mv /tmp/tc-docs-validate docs/validate" >&2
  fi
  exit 0
fi

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "gpu_setup: source it (source scripts/gpu_setup.sh): run as a program, its exports would be lost" >&2
  exit 2
fi

_tc_setup() {
  local logs=${GPU_SETUP_LOGS:-/tmp/gpu-setup}
  mkdir -p "$logs" || { echo "gpu_setup: cannot create $logs" >&2; return 1; }
  if ! ls "$_tc_carry"/whl/*.whl >/dev/null 2>&1; then
    echo "gpu_setup: no wheels in $_tc_carry/whl: run 'bash scripts/gpu_setup.sh --prepare' where pip works, and" \
         "carry .gpu" >&2
    return 1
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$_tc_carry"/whl/*.whl > "$logs/pip.log" 2>&1 \
    || { echo "gpu_setup: pip install failed: $logs/pip.log" >&2; return 1; }
  export PYTHONPATH=/tmp/site:$_tc_root${PYTHONPATH:+:$PYTHONPATH}
  export PATH=/tmp/site/bin:$PATH
  # libaio unpacked beside, not into /: the compiler and the loader are pointed at it.
  local aio=/tmp/libaio deb
  mkdir -p "$aio" || { echo "gpu_setup: cannot create $aio" >&2; return 1; }
  if ! ls "$_tc_carry"/deb/*.deb >/dev/null 2>&1; then
    echo "gpu_setup: no libaio .deb files in $_tc_carry/deb (bash scripts/gpu_setup.sh --prepare)" >&2
    return 1
  fi
  for deb in "$_tc_carry"/deb/*.deb; do
    dpkg -x "$deb" "$aio" || { echo "gpu_setup: dpkg -x $deb failed" >&2; return 1; }
  done
  local aio_lib=$aio/usr/lib/x86_64-linux-gnu
  [ -e "$aio_lib/libaio.so" ] || ln -sf libaio.so.1 "$aio_lib/libaio.so" \
    || { echo "gpu_setup: cannot link $aio_lib/libaio.so" >&2; return 1; }
  export CFLAGS="-I$aio/usr/include${CFLAGS:+ $CFLAGS}" LDFLAGS="-L$aio_lib${LDFLAGS:+ $LDFLAGS}"
  export CPATH=$aio/usr/include${CPATH:+:$CPATH}
  local cuda_home
  cuda_home=$(python3 -c "import torch.utils.cpp_extension as c; print(c.CUDA_HOME or '')" 2>/dev/null) \
    || { echo "gpu_setup: python3 cannot import torch's cpp_extension" >&2; return 1; }
  # DeepSpeed's async_io links -lcuda: at build time the toolkit's stub is enough, the driver's libcuda.so.1 loads.
  export LIBRARY_PATH=$aio_lib${cuda_home:+:$cuda_home/lib64:$cuda_home/lib64/stubs}${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$aio_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # DeepSpeed 0.19.8's JIT builder parses each TORCH_CUDA_ARCH_LIST entry as integers and stops at an
  # arch-specific one ("9.0a", set on the H200 machines): its ops need no sm_90a instruction, so build for 9.0.
  if [ -n "${TORCH_CUDA_ARCH_LIST:-}" ]; then
    export TORCH_CUDA_ARCH_LIST=$(sed -E 's/([0-9]+\.[0-9]+)[a-z]+/\1/g' <<< "$TORCH_CUDA_ARCH_LIST")
    echo "gpu_setup: TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
  fi
  # the wheel was built on a CPU machine: say which accelerator rather than let DeepSpeed guess
  export DS_ACCELERATOR=${DS_ACCELERATOR:-cuda}
  (cd "$_tc_root" && python3 setup.py -q build_ext --inplace) > "$logs/arena.log" 2>&1 \
    || { echo "gpu_setup: the arena did not build: $logs/arena.log" >&2; return 1; }
  # Each op once, verbosely, so that a failed JIT build is a log here, not a stack in every run. The two build at
  # once (separate extension folders): device time is what a lease is short of, and each build is mostly serial.
  local op failed=0
  local -A builds=()
  for op in AsyncIOBuilder CPUAdamBuilder; do
    python3 -c "from deepspeed.ops.op_builder import $op; $op().load(verbose=True)" > "$logs/$op.log" 2>&1 &
    builds[$op]=$!
  done
  for op in "${!builds[@]}"; do
    wait "${builds[$op]}" \
      || { echo "gpu_setup: DeepSpeed's $op did not build: $logs/$op.log" >&2; tail -20 "$logs/$op.log" >&2; failed=1; }
  done
  [ "$failed" = 0 ] || return 1
  echo "gpu_setup: ready (deepspeed $(python3 -c 'import deepspeed; print(deepspeed.__version__)' 2>/dev/null)," \
       "CUDA_HOME=${cuda_home:-none}, logs in $logs)"
}
_tc_setup
_tc_rc=$?
unset -f _tc_setup
unset _tc_root _tc_carry
return $_tc_rc
