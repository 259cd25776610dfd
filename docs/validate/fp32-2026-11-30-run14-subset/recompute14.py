"""Run 14 (a subset, the first with the compute figure from the probe's medians) recomputed with the fastest steps'
figure, which the calibration at 20:04 UTC wrote beside it ("from the fastest steps: ..." in the machine file's
compute source). Measured: the bench's median (steps 3-7). Run from the repository root:
python docs/validate/fp32-2026-11-30-run14-subset/recompute14.py"""
import dataclasses
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts"))
import validate_estimate as v  # noqa: E402
from tencache_ds.plan.machine import load_machine  # noqa: E402

machine = load_machine(os.path.join(HERE, "machine.json"))
fastest_flops = float(re.search(r"from the fastest steps: [0-9.]+ s, ([0-9.]+) GFLOP/s",
                                machine.sources["accelerator_flops_per_s"]).group(1)) * 1e9
predictions = json.load(open(os.path.join(HERE, "predictions.json")))["predictions"]
print("| configuration | arm | measured (s) | predicted, medians' figure (s) | error | predicted, fastest steps' "
      "figure (s) | error |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for name, p in predictions.items():
    other = v.predict_configuration(dataclasses.replace(machine, accelerator_flops_per_s=fastest_flops), p["model"],
                                    p["config"], p["host_cache_bytes"], 2, 64, False, dtype="fp32")
    measured = v.measured_from_bench(os.path.join(HERE, name))["arms"]
    for arm in ("stock", "tencache"):
        m, before, after = measured[arm]["step_time_s"], p["predicted"][arm]["step_time_s"], other[arm]["step_time_s"]
        print(f"| {name} | {arm} | {m:.3f} | {before:.3f} | {100 * (before / m - 1):+.0f}% "
              f"| {after:.3f} | {100 * (after / m - 1):+.0f}% |")
