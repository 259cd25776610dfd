"""Per arm: steps, median of steps 3+, peak RSS, fetch waits, NVMe bytes a step, optimizer budget, last loss bits.
Usage: python summary.py FOLDER (the *.result.json.gz there)."""
import glob, gzip, json, os, statistics, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.result.json.gz"))):
    result = json.load(gzip.open(path)); steps = result["steps"]; last = steps[-1]["stats"]
    times = [round(s["time_s"], 2) for s in steps]
    print(os.path.basename(path)[:-15], times, "median 3+", round(statistics.median(times[3:]), 2),
          "peak RSS GiB", round(max(s["peak_rss_bytes"] for s in steps) / 2**30, 3),
          "wait 3+", [round(s["stats"]["fetch_wait_s"], 2) for s in steps[3:]],
          "read/written GB", round(last["step_nvme_read_bytes"] / 1e9, 2), round(last["step_nvme_write_bytes"] / 1e9, 2),
          "optimizer budget", last["optimizer_cache_budget_bytes"], "loss bits", steps[-1]["loss_bits"])
