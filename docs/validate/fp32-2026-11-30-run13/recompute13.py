"""Run 13 recomputed with the compute figure from the probe's medians, which the calibration at 18:10 UTC wrote
beside the fastest steps' figure the predictions used ("from the medians: ..." in the machine files' compute
source). Measured: the median of steps 3-7 of both runs of each arm (the bench's own median), and of each run alone.
Run from the repository root: python docs/validate/fp32-2026-11-30-run13/recompute13.py"""
import dataclasses
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts"))
import validate_estimate as v  # noqa: E402
from tencache_ds.plan.machine import load_machine  # noqa: E402

WARMUP = 3
FILES = {"gpt2-tiny": "machine.json", "gpt2-small": "machine-gpt2-small.json",
         "gpt2-medium": "machine-gpt2-medium.json"}


def steps(name, arm, run):
    path = os.path.join(HERE, name, f"{arm}-{run}.result.json")
    return [step["time_s"] for step in json.load(open(path))["steps"][WARMUP:]]


def within(predicted, measured):
    return abs(predicted / measured - 1) <= 0.15


predictions = json.load(open(os.path.join(HERE, "predictions.json")))["predictions"]
print("| configuration | arm | measured: both runs / run 1 / run 2 (s) | predicted, fastest steps' figure (s) | error"
      " | predicted, medians' figure (s) | error |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
counts = {"fastest": 0, "medians": 0}
for name, p in predictions.items():
    machine = load_machine(os.path.join(HERE, FILES[p["model"]]))
    median_flops = float(re.search(r"from the medians: [0-9.]+ s, ([0-9.]+) GFLOP/s",
                                   machine.sources["accelerator_flops_per_s"]).group(1)) * 1e9
    now = v.predict_configuration(dataclasses.replace(machine, accelerator_flops_per_s=median_flops), p["model"],
                                  p["config"], p["host_cache_bytes"], 2, 64, False, dtype="fp32")
    for arm in ("stock", "tencache"):
        one, two = steps(name, arm, 1), steps(name, arm, 2)
        measured = statistics.median(one + two)
        before, after = p["predicted"][arm]["step_time_s"], now[arm]["step_time_s"]
        counts["fastest"] += within(before, measured)
        counts["medians"] += within(after, measured)
        print(f"| {name} | {arm} | {measured:.3f} / {statistics.median(one):.3f} / {statistics.median(two):.3f} "
              f"| {before:.3f} | {100 * (before / measured - 1):+.0f}% "
              f"| {after:.3f} | {100 * (after / measured - 1):+.0f}% |")
print()
print(f"Step time within 15%: {counts['fastest']} of {2 * len(predictions)} with the fastest steps' figure, "
      f"{counts['medians']} of {2 * len(predictions)} with the medians' figure.")
