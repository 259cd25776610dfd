import json, statistics, sys
# per arm: step times, weights hash, and per-step deltas of the optimizer's NVMe bytes and fills (stats are totals)
folder = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ab27"
for arm in ("old", "new", "old2", "new2"):
    r = json.load(open(f"{folder}/{arm}.json"))
    times = [round(s["time_s"], 2) for s in r["steps"]]
    prev, rows = {}, []
    for s in r["steps"]:
        st = s.get("stats") or {}
        cur = {k: st.get(k, 0) for k in ("optimizer_nvme_read_bytes", "optimizer_nvme_write_bytes",
                                          "optimizer_masters_from_partitions", "optimizer_cache_hits")}
        rows.append({k: round((cur[k] - prev.get(k, 0)) / 2**30, 2) if "bytes" in k else cur[k] - prev.get(k, 0)
                     for k in cur})
        prev = cur
    print(arm, times, "median 3-6:", statistics.median(times[2:]), r["weights_sha256"][:12])
    print("   read GiB", [x["optimizer_nvme_read_bytes"] for x in rows], "written GiB",
          [x["optimizer_nvme_write_bytes"] for x in rows], "filled", [x["optimizer_masters_from_partitions"] for x in rows],
          "hits", [x["optimizer_cache_hits"] for x in rows])
