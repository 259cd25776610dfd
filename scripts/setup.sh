#!/usr/bin/env bash
# Set up this machine for tencache_ds and run the main job (the default stock-vs-tencache bench).
#   bash scripts/setup.sh            # install everything, then `tencache-ds bench`
#   bash scripts/setup.sh --no-bench # install only
#   bash scripts/setup.sh --no-bench --test-ops  # and the ops only the tests use (scripts/test.sh)
# Idempotent: each step checks first and is skipped when already done.
set -euo pipefail
PY=${PYTHON:-python3}
# a path given (PYTHON=.venv/bin/python) is the caller's, absolute from here on: step 3 runs it from / (helper-219)
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" 2>/dev/null && pwd || echo "$(dirname "$PY")")/$(basename "$PY")" ;; esac
cd "$(dirname "$0")/.."
RUN_BENCH=1
TEST_OPS=0
for arg in "$@"; do
  case "$arg" in
    --no-bench) RUN_BENCH=0 ;;
    --test-ops) TEST_OPS=1 ;;
    *) echo "setup.sh: unknown option $arg (known: --no-bench, --test-ops)" >&2; exit 2 ;;
  esac
done
say() { printf '\n== %s\n' "$*"; }

# 0. A Python that is not there, or older than the package takes, stops here with what to install (a missing one
#    was called "the system's Python" below, with an empty name: helper-231).
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "setup.sh: no Python at '$PY': install python3 (3.10 or newer), or name one with PYTHON=..." >&2
  exit 2
fi
if ! $PY -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
  echo "setup.sh: $PY is Python $($PY -c 'import platform; print(platform.python_version())'); tencache_ds needs" \
       "3.10 or newer: install one, or name it with PYTHON=..." >&2
  exit 2
fi

#    A system Python that refuses pip installs (PEP 668: Debian 12, Ubuntu 24.04) stops here, before anything is
#    installed, with what to do, instead of at pip's first install with "externally-managed-environment".
if ! $PY - <<'PYEOF'
import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
managed = sys.prefix == sys.base_prefix and os.path.exists(marker)
sys.exit(1 if managed else 0)
PYEOF
then
  echo "setup.sh: $(command -v "$PY") is the system's Python, which does not take pip installs (PEP 668)." >&2
  echo "  Create a virtual environment and run this again in it:" >&2
  echo "    python3 -m venv .venv && . .venv/bin/activate && bash scripts/setup.sh" >&2
  exit 2
fi

# 1. libaio headers, for DeepSpeed's async_io op (stock ZeRO-Infinity's NVMe engine, which we compare against).
if [ ! -e /usr/include/libaio.h ]; then
  say "installing libaio-dev"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libaio-dev
fi

# 1a. a C/C++ compiler and this Python's headers: pip builds the native arena (csrc/, #include <Python.h>) and
#     DeepSpeed builds its ops with them; a fresh cloud or container image has neither (helper-215).
PY_INCLUDE="$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
if ! command -v cc >/dev/null 2>&1 || ! command -v g++ >/dev/null 2>&1 || [ ! -e "$PY_INCLUDE/Python.h" ]; then
  say "installing a C/C++ compiler and the Python headers (build-essential, python3-dev)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq build-essential python3-dev
  if [ ! -e "$PY_INCLUDE/Python.h" ]; then
    echo "setup.sh: $PY_INCLUDE/Python.h is still missing: install the headers of this Python (it is not the" >&2
    echo "  system's python3, whose python3-dev was installed) and run this again" >&2
    exit 2
  fi
fi

# 1b. mkfs.xfs, for the tests of checkpoints whose ZeRO file shares the swap files' blocks (reflinks): they mount
#     a small XFS image on a loop device (as root), and are skipped where that cannot be done. Optional.
if ! command -v mkfs.xfs >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  if [ -z "$SUDO" ] || sudo -n true 2>/dev/null; then
    say "installing xfsprogs (tests of reflinked checkpoints)"
    $SUDO apt-get install -y -qq xfsprogs >/dev/null 2>&1 \
      || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq xfsprogs >/dev/null 2>&1; } \
      || echo "xfsprogs could not be installed: the reflink tests will be skipped"
  fi
fi

# 2. torch. Never let pip resolve a bare "torch" on a machine without one: it would pull several GB of CUDA
#    wheels. Without a GPU we install the CPU build this machine kind provides; with one, the default (CUDA) build,
#    of the same tested version.
if ! $PY -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    say "installing torch==2.13.0 (CUDA build: a GPU is present)"; $PY -m pip install -q torch==2.13.0
  else
    # PyPI's x86_64 torch is the CUDA build: the CPU one is "+cpu", from where pip's configuration offers it (this
    # project's VMs: a local wheel folder), else from PyTorch's CPU index (helper-194: both branches were the same
    # command, which on a machine without such a configuration pulled the CUDA wheels)
    say "installing torch==2.13.0 (CPU build: no GPU)"
    $PY -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
      || $PY -m pip install -q "torch==2.13.0+cpu" --index-url https://download.pytorch.org/whl/cpu \
           --extra-index-url https://pypi.org/simple
  fi
fi

# 3. The package with its native arena and the bench/test extras, the installed torch held as it is: a
#    dependency that wants a newer one (accelerate's latest over a torch older than 2.6) made pip replace it with
#    PyPI's CUDA build (helper-231); held, pip picks versions that take this torch, or says which cannot.
#    Checked from / (from the checkout, Python imports the checkout's tencache_ds, installed or not: helper-215).
#    The native arena is rebuilt where a source under csrc/ is newer than it (a pulled change that kept the ABI
#    version: the old build loaded without a word; helper-231).
CSRC="$(pwd)/csrc"
if ! (cd / && $PY -c "import tencache_ds.memory as m, transformers, matplotlib, pytest, xdist, deepspeed, accelerate
import glob, importlib.metadata, importlib.util, os, tencache_ds.cli.main
importlib.metadata.version('tencache-ds')
assert m.native_available()
built = os.path.getmtime(importlib.util.find_spec('tencache_ds._tencache_arena').origin)
assert all(os.path.getmtime(source) <= built for source in glob.glob(os.path.join('$CSRC', '**'), recursive=True)
           if os.path.isfile(source))") 2>/dev/null; then
  say "installing tencache-ds (editable, with its native arena)"
  HOLD_TORCH="$(mktemp)"
  $PY -c "import torch; print('torch==' + torch.__version__)" > "$HOLD_TORCH"
  $PY -m pip install -q -e ".[bench,test]" -c "$HOLD_TORCH"
  rm -f "$HOLD_TORCH"
fi

# 4. DeepSpeed JIT-builds its ops on first use (minutes on 2 cores): build them now, once (cached under
#    ~/.cache/torch_extensions), so that the first training run does not pay for it. A build killed earlier
#    (Ctrl-C here, a timed-out doctor) can leave a stale `lock` in an op's build folder, on which load() would
#    wait forever without a word: check for one first and stop with the path and the `rm` that fixes it.
#    (DeepSpeed's ahead-of-time build, `DS_BUILD_AIO=1 DS_BUILD_CPU_ADAM=1 pip install deepspeed`, would need no
#    JIT lock at all; tried with deepspeed 0.19.8 here, its async_io op then fails to import with "undefined
#    symbol: io_submit" (not linked against libaio), so the ops are JIT-built once, here.)
#    --test-ops adds DeepSpeed's CPU Adagrad and Lion, which the suite trains with (test_parity.py, the scenarios
#    of test_zero_scenarios.py): built inside the suite they took 74 and 132 s on 2026-12-01, on the cores the
#    other test worker ran on, and stretched the scenarios' stock launch from about 50 s to 322 s.
OPS="async_io, cpu_adam, shm_comm"
if [ "$TEST_OPS" = 1 ]; then OPS="$OPS, cpu_adagrad, cpu_lion"; fi
say "pre-building DeepSpeed ops ($OPS); cached after the first time"
TEST_OPS=$TEST_OPS $PY - <<'PYEOF'
import os
import sys
import functools
import warnings
warnings.filterwarnings("ignore")
try:  # each op builder asks py-cpuinfo about the CPU (about 1 s a question): ask once (as scripts/train.py does)
    import cpuinfo
    cpuinfo.get_cpu_info = functools.lru_cache(maxsize=1)(cpuinfo.get_cpu_info)
except ImportError:  # DeepSpeed falls back to lscpu then
    pass
from deepspeed.accelerator import get_accelerator
from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder
from tencache_ds import ext_lock
from tencache_ds.errors import TencacheResourceError
builders = [AsyncIOBuilder(), CPUAdamBuilder()]
if get_accelerator().device_name() == "cpu":
    from deepspeed.ops.op_builder import ShareMemCommBuilder
    builders.append(ShareMemCommBuilder())
if os.environ["TEST_OPS"] == "1":
    from deepspeed.ops.op_builder import CPUAdagradBuilder, CPULionBuilder
    builders += [CPUAdagradBuilder(), CPULionBuilder()]
try:
    ext_lock.raise_if_stale_locks(ops=[builder.name for builder in builders])
except TencacheResourceError as err:
    sys.exit(f"setup.sh: cannot pre-build DeepSpeed's ops: {err}")
for builder in builders:
    builder.load(verbose=False)
    print(f"  {builder.name}: ok")
PYEOF

if [ "$RUN_BENCH" = 1 ]; then
  say "main job: tencache-ds bench (stock ZeRO-Infinity vs tencache, embedded default)"
  $PY -m tencache_ds.cli.main bench  # (not the console script: PYTHON's folder need not be on PATH)
fi
