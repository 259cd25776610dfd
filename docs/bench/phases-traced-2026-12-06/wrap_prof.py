"""scripts/train.py with torch.profiler (memory) around one backward (PROF_STEP) and one optimizer step."""
import os, sys, runpy
import tencache_ds  # noqa
import torch
import deepspeed.runtime.engine as E
target = int(os.environ.get("PROF_STEP", "3")); seen = {"backward": 0, "step": 0}
def profiled(name):
    orig = getattr(E.DeepSpeedEngine, name)
    def w(self, *a, **k):
        i = seen[name]; seen[name] += 1
        if i != target:
            return orig(self, *a, **k)
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=False, record_shapes=True) as p:
            out = orig(self, *a, **k)
        table = p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_memory_usage", row_limit=30)
        open(os.environ["PROF_OUT"] + f".{name}.txt", "w").write(table)
        big = [e for e in p.events() if e.cpu_memory_usage >= (32 << 20)]
        with open(os.environ["PROF_OUT"] + f".{name}.big.txt", "w") as f:
            for e in big:
                f.write(f"{e.name} {e.cpu_memory_usage/2**20:.1f} MiB shapes={e.input_shapes}\n")
        return out
    setattr(E.DeepSpeedEngine, name, w)
profiled("backward"); profiled("step")
sys.path.insert(0, os.path.abspath("scripts"))
sys.argv = ["scripts/train.py"] + sys.argv[1:]
runpy.run_path("scripts/train.py", run_name="__main__")
