"""Experiment: the backward's allocations from glibc's heap (mmap off, no trimming) from engine.backward until stage
3's step starts, where mmap comes back and malloc_trim(0) returns the free pages. Wraps then runs ARGV (step_phases
or train.py)."""
import ctypes, os, runpy, sys, functools, time
libc = ctypes.CDLL("libc.so.6")
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
import deepspeed
from deepspeed.runtime.engine import DeepSpeedEngine
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as S3
STATS = {"trim_s": 0.0, "trims": 0}
orig_backward, orig_step = DeepSpeedEngine.backward, S3.step
@functools.wraps(orig_backward)
def backward(self, *a, **k):
    libc.mallopt(M_MMAP_MAX, 0); libc.mallopt(M_TRIM_THRESHOLD, 1 << 40)
    return orig_backward(self, *a, **k)
from tencache_ds.integrations.deepspeed.memory_pressure import HostTierGovernor
orig_before_update = HostTierGovernor.before_update
def before_update(self):
    # the update starts: mmap back, free pages returned, before the rise meter reads the level
    libc.mallopt(M_MMAP_MAX, 65536); libc.mallopt(M_TRIM_THRESHOLD, 64 << 20)
    t = time.perf_counter(); libc.malloc_trim(0); STATS["trim_s"] += time.perf_counter() - t; STATS["trims"] += 1
    return orig_before_update(self)
DeepSpeedEngine.backward, HostTierGovernor.before_update = backward, before_update
import atexit
atexit.register(lambda: print(f"HEAPWRAP trims {STATS['trims']} total {STATS['trim_s']:.3f}s", flush=True))
sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
