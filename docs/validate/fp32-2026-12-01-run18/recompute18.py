"""Run 18 recomputed: the predictions the run wrote (the model of run 16, unchanged: the code of 3978e75) against the
median of steps 3-7 of both runs of each arm (the bench's own median), and of each run alone.
Run from the repository root: python docs/validate/fp32-2026-12-01-run18/recompute18.py"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import recompute as r  # noqa: E402

print("| configuration | arm | measured: both runs / run 1 / run 2 (s) | predicted (s) | error |")
print("| --- | --- | ---: | ---: | ---: |")
counts = {"as run": 0}
predictions = r.predictions(HERE)
r.print_rows(HERE, lambda name, p: {arm: {"as run": p["predicted"][arm]["step_time_s"]}
                                    for arm in ("stock", "tencache")}, counts)
print()
print(f"Step time within 15%: {counts['as run']} of {2 * len(predictions)} as predicted.")
