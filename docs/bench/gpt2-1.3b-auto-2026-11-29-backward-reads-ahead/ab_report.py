"""Ad-hoc: the A/B runs of this folder, steps 3 on: step time, optimizer and parameter NVMe wait, drive busy
fraction, NVMe read per step, the host budget at the end, the backward's reads ahead, peak RSS."""
import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))
from tencache_ds.bench.records import read_json_record as load  # noqa: E402  (result files are archived: .gz)


for path in sorted(glob.glob(os.path.join(HERE, "*.metrics.jsonl"))):
    with open(path) as handle:
        rows = [json.loads(line) for line in handle]
    late = [row for row in rows if row["step"] >= 3]
    steps = load(path.replace(".metrics.jsonl", ".result.json"))["steps"]
    print(os.path.basename(path).split(".")[0],
          "step", [round(r["step_time_s"], 1) for r in late],
          "median %.2f" % statistics.median(r["step_time_s"] for r in late),
          "optwait", [round(r["optimizer_nvme_wait_s"], 1) for r in late],
          "paramwait", [round(r["param_nvme_wait_s"], 1) for r in late],
          "busy", [round(r["nvme_busy_fraction"], 2) for r in late],
          "rd GiB", [round(r["nvme_read_bytes"] / 2**30, 1) for r in late],
          "budget", round(late[-1]["host_cache_budget_bytes"] / 2**30, 2),
          "reads ahead", [s["stats"].get("optimizer_backward_reads_ahead") for s in steps],
          "peak GiB", round(max(s["peak_rss_bytes"] for s in steps) / 2**30, 2))
