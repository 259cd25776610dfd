"""The table of docs/benchmarks.md, "Kept optimizer state where it is most of the state": python summary.py"""
import json
import os
import statistics

from tencache_ds.bench.records import read_json_record  # (reads NAME or NAME.gz)

HERE = os.path.dirname(os.path.abspath(__file__))
for arm in ("auto-2", "small-2", "small-3", "auto-3"):
    steps = read_json_record(os.path.join(HERE, f"{arm}.result.json"))["steps"]
    rows = [json.loads(line) for line in open(os.path.join(HERE, f"{arm}.metrics.jsonl"))]
    times = [step["time_s"] for step in steps]
    print(f"{arm}: steps {', '.join(f'{t:.2f}' for t in times)}; median of steps 3-6 {statistics.median(times[3:]):.2f} s; "
          f"peak RSS {max(step['peak_rss_bytes'] for step in steps) / 2**30:.2f} GiB; NVMe read/written "
          f"{rows[-1]['nvme_read_bytes'] / 1e9:.2f}/{rows[-1]['nvme_write_bytes'] / 1e9:.2f} GB a step; optimizer wait "
          f"{rows[-1]['optimizer_nvme_wait_s']:.2f} s; drive busy {rows[-1]['nvme_busy_fraction']:.2f}; host budget "
          f"{rows[-1]['host_cache_budget_bytes'] / 2**30:.2f} GiB; last loss {steps[-1]['loss_bits']}")
