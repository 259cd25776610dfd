"""Run scripts/train.py with a VmRSS sampler and phase markers (forward/backward/step begin and end)."""
import os, sys, threading, time, runpy
out = os.environ["RSS_OUT"]
f = open(out, "w", buffering=1)
t0 = time.perf_counter()
def rss():
    d = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "RssAnon", "RssFile", "RssShmem")):
            k, v = line.split(":"); d[k] = int(v.split()[0]) * 1024
    return d
def sampler():
    while True:
        d = rss(); f.write(f"S {time.perf_counter()-t0:.3f} {d['VmRSS']} {d['RssAnon']} {d['RssFile']}\n"); time.sleep(0.05)
threading.Thread(target=sampler, daemon=True).start()
import deepspeed.runtime.engine as E
def mark(name):
    orig = getattr(E.DeepSpeedEngine, name)
    def w(self, *a, **k):
        f.write(f"B {time.perf_counter()-t0:.3f} {name}\n")
        try: return orig(self, *a, **k)
        finally: f.write(f"E {time.perf_counter()-t0:.3f} {name}\n")
    setattr(E.DeepSpeedEngine, name, w)
for n in ("forward", "backward", "step"): mark(n)
sys.path.insert(0, os.path.abspath("scripts"))
sys.argv = ["scripts/train.py"] + sys.argv[1:]
runpy.run_path("scripts/train.py", run_name="__main__")
