"""Run scripts/train.py with a timeline: engine phases, stage 3's per-sub-group swap-in / Adam / swap-out, the
optimizer store's waits, and every I/O piece tencache's engine moves (thread, read/write, bytes, path)."""
import os, sys, threading, time, runpy
out = open(os.environ["TRACE_OUT"], "w", buffering=1)
t0 = time.perf_counter()
lock = threading.Lock()
def log(*fields):
    with lock:
        out.write(" ".join(str(f) for f in fields) + "\n")
import resource
def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, time.thread_time(), r.ru_minflt, r.ru_majflt
def timed(cls, name, tag, arg=None):
    orig = getattr(cls, name)
    def w(self, *a, **k):
        b = time.perf_counter() - t0
        u0 = usage() if arg is None else None
        try: return orig(self, *a, **k)
        finally:
            label = a[0] if (arg == 0 and a) else ""
            if arg == "key" and a: label = os.path.basename(str(a[0]))
            if u0 is not None:
                u1 = usage(); label = "cpu=%.2f,main=%.2f,minflt=%d,majflt=%d" % tuple(x - y for x, y in zip(u1, u0))
            log("P", tag, label, f"{b:.4f}", f"{time.perf_counter()-t0:.4f}")
    setattr(cls, name, w)

def _rss_sampler():
    page = os.sysconf("SC_PAGE_SIZE")
    while True:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * page
        log("M", f"{time.perf_counter()-t0:.3f}", rss)
        time.sleep(0.05)
threading.Thread(target=_rss_sampler, daemon=True).start()
sys.path.insert(0, os.getcwd())  # the tree the run is started in, not the installed one
import tencache_ds  # installs the swappers
log("TENCACHE", tencache_ds.__file__)
import deepspeed.runtime.engine as E
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as S3
from tencache_ds.io import direct_io as D
from tencache_ds.cache import entry_store as ES
for n in ("forward", "backward", "step"): timed(E.DeepSpeedEngine, n, n)
timed(S3, "_optimizer_step", "adam", 0)
timed(S3, "_optimizer_states_and_gradient_swap_in", "swapin", 0)
timed(S3, "_optimizer_states_and_gradient_swap_out", "swapout", 0)
timed(ES.EntryStore, "wait_read", "wait", "key")
orig_piece = D.DirectFileIO._run_piece
def piece(self, request, start, end):
    b = time.perf_counter() - t0
    try: return orig_piece(self, request, start, end)
    finally:
        log("IO", threading.current_thread().name, "W" if request.is_write else "R", end - start,
            os.path.basename(request.path), f"{b:.4f}", f"{time.perf_counter()-t0:.4f}")
D.DirectFileIO._run_piece = piece
orig_submit = D.DirectFileIO._submit
def submit(self, is_write, tensor, path, nbytes, file_offset):
    log("SUB", "W" if is_write else "R", os.path.basename(path), f"{time.perf_counter()-t0:.4f}")
    return orig_submit(self, is_write, tensor, path, nbytes, file_offset)
D.DirectFileIO._submit = submit
if os.environ.get("NORM_SCRATCH") == "1":
    from deepspeed.runtime.zero.utils import get_norm_dtype  # noqa
    import deepspeed.runtime.zero.stage3 as S3M
    scratch = {}
    CAP = 1 << 25   # elements: 256 MiB of float64 at most; larger gradients as stock
    def norm2(self, input, buffer_size=250000000):
        norm = None
        dtype = S3M.get_norm_dtype()
        for part in input.view(-1).split(buffer_size):
            n = part.numel()
            if n <= CAP:
                buf = scratch.get(dtype)
                if buf is None or buf.numel() < n:
                    buf = scratch[dtype] = torch.empty(max(n, 1 << 24), dtype=dtype)
                view = buf[:n]; view.copy_(part.data); value = view.norm(2) ** 2.0
            else:
                value = part.data.to(dtype).norm(2) ** 2.0
            norm = value if norm is None else norm + value
        return norm ** 0.5
    import torch
    S3.__dict__  # noqa
    S3._constant_buffered_norm2 = norm2

import traceback
from tencache_ds.memory import pool as _POOL
_orig_ap = _POOL.BufferPool.acquire_pageable
def _ap(self, nbytes, *a, **k):
    b = _orig_ap(self, nbytes, *a, **k)
    if nbytes > 50_000_000:
        st = "|".join(f"{os.path.basename(fr.filename)}:{fr.lineno}:{fr.name}" for fr in traceback.extract_stack()[-9:-1])
        log("ALLOC", self.name if hasattr(self, "name") else "?", nbytes, f"{time.perf_counter()-t0:.4f}", st)
    return b
_POOL.BufferPool.acquire_pageable = _ap
_orig_rs = _POOL.BufferPool.restore
def _rs(self, size, count):
    n = _orig_rs(self, size, count)
    if n:
        st = "|".join(f"{os.path.basename(fr.filename)}:{fr.lineno}:{fr.name}" for fr in traceback.extract_stack()[-9:-1])
        log("RESTORE", size, n, f"{time.perf_counter()-t0:.4f}", st)
    return n
_POOL.BufferPool.restore = _rs
sys.path.insert(0, os.path.abspath("scripts"))
sys.argv = ["scripts/train.py"] + sys.argv[1:]
runpy.run_path("scripts/train.py", run_name="__main__")
