"""The drive's rate as tencache's training steps saw it, against the calibration's figures, for every prospective
fp32 run with a tencache metrics file: each 25% and streaming row's NVMe bytes (read and written) over the seconds
its engine had a request executing (``nvme_busy_fraction`` x step, metrics.py), the median of the measured steps
after the warm-up, with the mean queue depth while busy. Run from the repository root:

    python docs/validate/drive-into-arena-2026-12-06/steps_busy_rate.py > docs/validate/drive-into-arena-2026-12-06/steps_busy_rate.txt
"""
import glob
import json
import os
import statistics

WARMUP = 3  # every run's --warmup

for run in sorted(glob.glob("docs/validate/fp32-*")):
    machine_file = os.path.join(run, "machine.json")
    if not os.path.exists(machine_file):
        continue
    with open(machine_file) as handle:
        machine = json.load(handle)
    figures = [machine["nvme_read_bytes_per_s_per_drive"], machine["nvme_write_bytes_per_s_per_drive"],
               machine.get("nvme_mixed_bytes_per_s_per_drive")]
    rows = []
    for budget in ("quarter", "stream"):
        for metrics in sorted(glob.glob(os.path.join(run, f"*-{budget}", "tencache-1.metrics.jsonl"))):
            with open(metrics) as handle:
                steps = [json.loads(line) for line in handle][WARMUP:]
            busy = [step for step in steps if step.get("nvme_busy_fraction")]
            if not busy:
                continue
            rate = statistics.median((step["nvme_read_bytes"] + step["nvme_write_bytes"])
                                     / (step["nvme_busy_fraction"] * step["step_time_s"]) for step in busy)
            depth = statistics.median(step["nvme_queue_depth"] for step in busy)
            rows.append(f"{os.path.basename(os.path.dirname(metrics))} {rate / 1e9:.2f} at {depth:.1f}")
    if rows:
        print(f"{os.path.basename(run)}: calibrated read / write / mixed "
              + " / ".join(f"{figure / 1e9:.2f}" if figure else "-" for figure in figures)
              + " GB/s; the steps' GB/s of busy drive: " + "; ".join(rows))
