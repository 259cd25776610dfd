"""Run 11's stock rows recomputed with the step model as committed (no stock aio factors: the calibration at 12:41
also wrote `stock_aio_read_factor` 0.685 and `stock_aio_write_factor` 0.753, measured with pageable buffers where
stock swaps from page-locked ones, removed from the machine files here), the tencache rows as predicted at 12:42.
Run from the repository root: python docs/validate/fp32-2026-11-30-run11/recompute11.py"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts"))
import validate_estimate as v  # noqa: E402
from tencache_ds.plan.machine import load_machine  # noqa: E402

FILES = {"gpt2-tiny": "machine.json", "gpt2-small": "machine-gpt2-small.json",
         "gpt2-medium": "machine-gpt2-medium.json"}
rows = json.load(open(os.path.join(HERE, "rows.json")))
within = 0
print("| configuration | arm | predicted at 12:42 / measured (s) | error | recomputed (s) | error |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for row in rows:
    model = "-".join(row["name"].split("-")[:2])
    measured, predicted = row["measured"]["step_time_s"], row["predicted"]["step_time_s"]
    now = predicted
    if row["arm"] == "stock":
        machine = load_machine(os.path.join(HERE, FILES[model]))
        config = v.CONFIG_FOR.get(model, v.DEFAULT_CONFIG)
        now = v.predict_configuration(machine, model, config, "auto", 2, 64, False,
                                      dtype="fp32")["stock"]["step_time_s"]
    within += abs(now / measured - 1) <= 0.15
    print(f"| {row['name']} | {row['arm']} | {predicted:.3f} / {measured:.3f} "
          f"| {100 * (predicted / measured - 1):+.0f}% | {now:.3f} | {100 * (now / measured - 1):+.0f}% |")
print(f"\nStep time within 15%, stock recomputed: {within} of {len(rows)}.")
