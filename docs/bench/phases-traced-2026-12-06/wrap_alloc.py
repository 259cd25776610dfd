import os, sys, time, runpy, resource
sys.path.insert(0, os.getcwd())
out = open("/tmp/trace/alloc.log", "w", buffering=1)
t0 = time.perf_counter()
import tencache_ds  # noqa
from tencache_ds.memory import pool as P, arena as A
import deepspeed.runtime.engine as E
def flt(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def wrapc(cls, name, tag):
    orig = getattr(cls, name)
    def w(self, *a, **k):
        f0 = flt(); r = orig(self, *a, **k)
        out.write(f"{time.perf_counter()-t0:.3f} {tag} args={[x for x in a if isinstance(x, int)]} ret={r if isinstance(r, int) else ''} flt={flt()-f0}\n")
        return r
    setattr(cls, name, w)
wrapc(P.BufferPool, "_acquire_fallback", "fallback")
wrapc(A.PinnedArena, "retire", "retire")
wrapc(A.PinnedArena, "restore", "restore")
for n in ("forward", "backward", "step"):
    orig = getattr(E.DeepSpeedEngine, n)
    def w(self, *a, _o=orig, _n=n, **k):
        f0 = flt(); b = time.perf_counter() - t0
        try: return _o(self, *a, **k)
        finally: out.write(f"{b:.3f} {_n} end={time.perf_counter()-t0:.3f} flt={flt()-f0}\n")
    setattr(E.DeepSpeedEngine, n, w)
sys.path.insert(0, os.path.abspath("scripts"))
sys.argv = ["scripts/train.py"] + sys.argv[1:]
runpy.run_path("scripts/train.py", run_name="__main__")
