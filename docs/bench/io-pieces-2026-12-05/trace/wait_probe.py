"""Run a script with EntryStore.wait_read/lend_copied/lend_new timed: (t, store, key, op, seconds) to $WAIT_PROBE_OUT."""
import json, os, runpy, sys, time, atexit
from tencache_ds.cache import entry_store as es
t0 = time.monotonic(); rec = []
def wrap(name):
    orig = getattr(es.EntryStore, name)
    def f(self, key, *a, **k):
        s = time.monotonic()
        try:
            return orig(self, key, *a, **k)
        finally:
            e = time.monotonic()
            rec.append((round(s - t0, 4), self.name, str(key), name, round(e - s, 4)))
    setattr(es.EntryStore, name, f)
for n in ("wait_read", "lend_copied", "flush_key", "wait_writes", "start_read", "release", "mark_changed"):
    if hasattr(es.EntryStore, n): wrap(n)
from tencache_ds.io import direct_io as dio
import threading
iorec = []
if hasattr(dio.DirectFileIO, "_run_piece"):
    _orig_run = dio.DirectFileIO._run_piece
    def _run(self, request, start, end):
        s = time.monotonic()
        try:
            return _orig_run(self, request, start, end)
        finally:
            iorec.append((round(s - t0, 4), round(time.monotonic() - t0, 4), int(request.is_write), end - start, request.path.split("/")[-1], threading.current_thread().name))
    dio.DirectFileIO._run_piece = _run
else:
    _orig_run = dio.DirectFileIO._run
    def _run(self, is_write, tensor, address, nbytes, path, file_offset):
        s = time.monotonic()
        try:
            return _orig_run(self, is_write, tensor, address, nbytes, path, file_offset)
        finally:
            iorec.append((round(s - t0, 4), round(time.monotonic() - t0, 4), int(is_write), nbytes, path.split("/")[-1], threading.current_thread().name))
    dio.DirectFileIO._run = _run
atexit.register(lambda: json.dump(iorec, open(os.environ["WAIT_PROBE_OUT"] + ".io", "w")))
import deepspeed
orig_step = deepspeed.runtime.engine.DeepSpeedEngine.step
def snap():
    v = dict(l.split() for l in open("/proc/vmstat"))
    cpu = open("/proc/stat").readline().split()[1:]
    me = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    return {"vm": {k: int(v[k]) for k in ("pgscan_kswapd", "pgsteal_kswapd", "pgscan_direct", "compact_stall", "pgfault", "pgmajfault", "thp_fault_alloc", "pswpin", "pswpout", "nr_free_pages", "nr_file_pages", "pgfree") if k in v}, "cpu": [int(x) for x in cpu], "self_utime": int(me[11]), "self_stime": int(me[12]), "minflt": int(me[7])}
snaps = []
atexit.register(lambda: json.dump(snaps, open(os.environ["WAIT_PROBE_OUT"] + ".snaps", "w")))
def step(self, *a, **k):
    snaps.append((round(time.monotonic() - t0, 4), "update-begin", snap()))
    rec.append((round(time.monotonic() - t0, 4), "engine", "step", "begin", 0))
    r = orig_step(self, *a, **k)
    rec.append((round(time.monotonic() - t0, 4), "engine", "step", "end", 0)); snaps.append((round(time.monotonic() - t0, 4), "update-end", snap())); return r
deepspeed.runtime.engine.DeepSpeedEngine.step = step
ob = deepspeed.runtime.engine.DeepSpeedEngine.backward
def backward(self, *a, **k):
    rec.append((round(time.monotonic() - t0, 4), "engine", "backward", "begin", 0))
    return ob(self, *a, **k)
deepspeed.runtime.engine.DeepSpeedEngine.backward = backward
atexit.register(lambda: json.dump(rec, open(os.environ["WAIT_PROBE_OUT"], "w")))
sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
