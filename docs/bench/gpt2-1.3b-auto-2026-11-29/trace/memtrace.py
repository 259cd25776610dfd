"""Ad-hoc: per-phase anon RSS peaks and the optimizer tier's footprint, for one run of scripts/train.py.

    python3 -m deepspeed.launcher.runner --num_gpus 1 memtrace.py OUT.json -- scripts/train.py ARGS...
"""
import json, os, runpy, sys, threading, time
ARGV = [a for a in sys.argv if not a.startswith("--local_rank")]
out = ARGV[1]; args = ARGV[3:]
SAMPLES = []
EVENTS = []
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
def sampler():
    while True:
        SAMPLES.append((time.time(), rss()))
        time.sleep(0.01)
threading.Thread(target=sampler, daemon=True).start()
import deepspeed.runtime.engine as E
def tier(engine):
    sw = getattr(getattr(engine, "optimizer", None), "optimizer_swapper", None)
    if sw is None or not hasattr(sw, "host_footprint_bytes"):
        return None
    return dict(footprint=sw.host_footprint_bytes(), used=sw.budget.used_bytes, budget=sw.budget.total_bytes)
for name in ("forward", "backward", "step"):
    orig = getattr(E.DeepSpeedEngine, name)
    def wrap(self, *a, _orig=orig, _name=name, **k):
        EVENTS.append((time.time(), _name + ":start", rss(), tier(self)))
        r = _orig(self, *a, **k)
        EVENTS.append((time.time(), _name + ":end", rss(), tier(self)))
        return r
    setattr(E.DeepSpeedEngine, name, wrap)
def dump():
    # per phase: peak anon RSS between start and end
    phases = []
    starts = {}
    for t, ev, r, tr in EVENTS:
        name, edge = ev.split(":")
        if edge == "start":
            starts[name] = (t, r, tr)
        else:
            t0, r0, tr0 = starts[name]
            peak = max((s for ts, s in SAMPLES if t0 <= ts <= t), default=r)
            phases.append(dict(phase=name, t0=t0, t1=t, rss_start=r0, rss_end=r, rss_peak=peak,
                               tier_start=tr0, tier_end=tr))
    json.dump(phases, open(out, "w"), indent=1)
import atexit; atexit.register(dump)
sys.argv = [args[0]] + args[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
runpy.run_path(args[0], run_name="__main__")
