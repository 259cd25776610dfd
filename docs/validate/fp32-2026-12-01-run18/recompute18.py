"""Run 18 recomputed: the predictions the run wrote (the model of run 16, unchanged: the code of 3978e75), and run
16's predictions (the same configurations and model, its calibration of 00:12-00:17 UTC) against the same
measurements: the median of steps 3-7 of both runs of each arm (the bench's own median), and of each run alone.
Run from the repository root: python docs/validate/fp32-2026-12-01-run18/recompute18.py"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import recompute as r  # noqa: E402

run16 = r.predictions(os.path.join(os.path.dirname(HERE), "fp32-2026-11-30-run16"))
print("| configuration | arm | measured: both runs / run 1 / run 2 (s) | predicted (s) | error "
      "| run 16's prediction (s) | error |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
counts = {"as run": 0, "run 16": 0}
predictions = r.predictions(HERE)
r.print_rows(HERE, lambda name, p: {arm: {"as run": p["predicted"][arm]["step_time_s"],
                                          "run 16": run16[name]["predicted"][arm]["step_time_s"]}
                                    for arm in ("stock", "tencache")}, counts)
print()
total = 2 * len(predictions)
print(f"Step time within 15%: {counts['as run']} of {total} as predicted, {counts['run 16']} of {total} with run 16's "
      f"predictions.")
