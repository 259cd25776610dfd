"""The A/B of the gradient lent in place, tried and reverted (docs/benchmarks.md, "Tried and reverted: the update lent
stage 3's fp32 gradient in place"): per run its peak RSS,
median step after 3 warm-up steps, optimizer wait and the updates lent in place; and whether every run of a shape
gave the same loss bits (and weights, where gathered).

    python docs/bench/gradients-in-place-2026-12-04/summary.py
"""
import glob
import gzip
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def metrics(result_path):
    path = result_path.split(".result.json")[0] + ".metrics.jsonl"
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


for folder, warmup in (("one-sub-group", 3), ("beyond-ram", 3)):
    bits = {}
    print(f"{folder}:")
    for path in sorted(glob.glob(os.path.join(HERE, folder, "*.result.json*"))):
        name = os.path.basename(path).split(".result.json")[0]
        result, records = load(path), metrics(path)
        steps = result["steps"]
        shape = name.rsplit("-", 2)[0] if folder == "one-sub-group" else "gpt2-1.3b"
        bits.setdefault(shape, set()).add((tuple(s["loss_bits"] for s in steps), result.get("weights_sha256")))
        wait = statistics.median(r["fetch_wait_s"] for r in records[warmup:]) if records[warmup:] else float("nan")
        print(f"  {name:22s} peak RSS {max(s['peak_rss_bytes'] for s in steps) / 2**30:6.2f} GiB  "
              f"step {statistics.median(s['time_s'] for s in steps[warmup:]):6.2f} s  wait {wait:5.2f} s  "
              f"lent in place {steps[-1]['stats'].get('optimizer_gradients_lent_whole', 0)}")
    for shape, seen in sorted(bits.items()):
        print(f"  {shape}: {'the same loss bits and weights in every run' if len(seen) == 1 else 'DIFFERENT BITS'}")
