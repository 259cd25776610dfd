"""Run 13 recomputed with the compute figure from the probe's medians, which the calibration at 18:10 UTC wrote
beside the fastest steps' figure the predictions used ("from the medians: ..." in the machine files' compute
source). Measured: the median of steps 3-7 of both runs of each arm (the bench's own median), and of each run alone.
Run from the repository root: python docs/validate/fp32-2026-11-30-run13/recompute13.py"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import recompute as r  # noqa: E402

print("| configuration | arm | measured: both runs / run 1 / run 2 (s) | predicted, fastest steps' figure (s) | error"
      " | predicted, medians' figure (s) | error |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
counts = {"fastest": 0, "medians": 0}
predictions = r.predictions(HERE)


def columns(name, p):
    machine = r.machine_for(HERE, p["model"])
    now = r.predicted_again(machine, p, accelerator_flops_per_s=r.compute_figure(machine, "from the medians"))
    return {arm: {"fastest": p["predicted"][arm]["step_time_s"], "medians": now[arm]["step_time_s"]}
            for arm in ("stock", "tencache")}


r.print_rows(HERE, columns, counts)
print()
print(f"Step time within 15%: {counts['fastest']} of {2 * len(predictions)} with the fastest steps' figure, "
      f"{counts['medians']} of {2 * len(predictions)} with the medians' figure.")
