"""Run 16 recomputed: the predictions the run wrote (the code of f129844: the drive shared by the stores' queues,
plan/step_model/drive.py), and the same configurations on the same machine files with the model before it (5cd396d:
one queue per direction, or one for both where the mixed rate is at most the harmonic mean of the two rates;
``predicted-before-5cd396d.json``, written by ``predict_before.py`` run from a worktree at 5cd396d). Measured: the
median of steps 3-7 of both runs of each arm (the bench's own median), and of each run alone.
Run from the repository root: python docs/validate/fp32-2026-11-30-run16/recompute16.py"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import recompute as r  # noqa: E402

with open(os.path.join(HERE, "predicted-before-5cd396d.json")) as handle:
    before = json.load(handle)["predictions"]
print("| configuration | arm | measured: both runs / run 1 / run 2 (s) | predicted (s) | error "
      "| the model before (5cd396d) (s) | error |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
counts = {"as run": 0, "before": 0}
predictions = r.predictions(HERE)
r.print_rows(HERE, lambda name, p: {arm: {"as run": p["predicted"][arm]["step_time_s"], "before": before[name][arm]}
                                    for arm in ("stock", "tencache")}, counts)
print()
total = 2 * len(predictions)
print(f"Step time within 15%: {counts['as run']} of {total} as predicted, {counts['before']} of {total} with the "
      f"model before the drive's queues were shared.")
