"""Run 12 (a subset) recomputed with the compute figure from the probe's medians, which the calibration at 15:38 UTC
wrote beside the fastest step's figure it used ("from the medians: ..." in the machine files' compute source).
Measured: the median of steps 3-7 of each arm's 8-step run. Run from the repository root:
python docs/validate/fp32-2026-11-30-run12-subset/recompute12.py"""
import dataclasses
import glob
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts"))
import validate_estimate as v  # noqa: E402
from tencache_ds.plan.machine import load_machine  # noqa: E402

FILES = {"gpt2-small": "machine.json", "gpt2-medium": "machine-gpt2-medium.json"}
predictions = json.load(open(os.path.join(HERE, "predictions.json")))["predictions"]
print("| configuration | arm | measured (s) | predicted, fastest steps' figure (s) | error | predicted, medians' figure (s)"
      " | error |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for name, p in predictions.items():
    machine = load_machine(os.path.join(HERE, FILES[p["model"]]))
    median_flops = float(re.search(r"from the medians: [0-9.]+ s, ([0-9.]+) GFLOP/s",
                                   machine.sources["accelerator_flops_per_s"]).group(1)) * 1e9
    now = v.predict_configuration(dataclasses.replace(machine, accelerator_flops_per_s=median_flops), p["model"],
                                  p["config"], p["host_cache_bytes"], 2, 64, False, dtype="fp32")
    for arm in ("stock", "tencache"):
        result = glob.glob(os.path.join(HERE, name, f"{arm}-1.result.json"))[0]
        measured = statistics.median(step["time_s"] for step in json.load(open(result))["steps"][3:])
        before, after = p["predicted"][arm]["step_time_s"], now[arm]["step_time_s"]
        print(f"| {name} | {arm} | {measured:.3f} | {before:.3f} | {100 * (before / measured - 1):+.0f}% "
              f"| {after:.3f} | {100 * (after / measured - 1):+.0f}% |")
