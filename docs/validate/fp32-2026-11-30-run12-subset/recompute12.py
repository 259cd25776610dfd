"""Run 12 (a subset) recomputed with the compute figure from the probe's medians, which the calibration at 15:38 UTC
wrote beside the fastest step's figure it used ("from the medians: ..." in the machine files' compute source).
Measured: the median of steps 3-7 of each arm's 8-step run. Run from the repository root:
python docs/validate/fp32-2026-11-30-run12-subset/recompute12.py"""
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import recompute as r  # noqa: E402

FILES = {"gpt2-small": "machine.json", "gpt2-medium": "machine-gpt2-medium.json"}
print("| configuration | arm | measured (s) | predicted, fastest steps' figure (s) | error "
      "| predicted, medians' figure (s) | error |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for name, p in r.predictions(HERE).items():
    machine = r.machine_for(HERE, p["model"], FILES)
    now = r.predicted_again(machine, p, accelerator_flops_per_s=r.compute_figure(machine, "from the medians"))
    for arm in ("stock", "tencache"):
        measured = statistics.median(r.measured_steps(HERE, name, arm, 1))
        before, after = p["predicted"][arm]["step_time_s"], now[arm]["step_time_s"]
        print(f"| {name} | {arm} | {measured:.3f} {r.error(before, measured)}{r.error(after, measured)}|")
