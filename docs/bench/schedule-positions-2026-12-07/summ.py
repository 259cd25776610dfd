import json, glob, statistics
for f in sorted(glob.glob("/tmp/ab/*-*.json")):
    r = json.load(open(f))
    steps = r["steps"]
    times = [s["time_s"] for s in steps]
    st = steps[-1]["stats"]
    keys = [k for k in st if "scheduled" in k or "prefetch_late" in k or "param_io_wait" in k or k in ("param_hits","param_misses")]
    print(f.split("/")[-1], "times", [round(t,2) for t in times], "median3-5", round(statistics.median(times[2:]),2),
          {k: st[k] for k in keys}, "loss", steps[-1]["loss_bits"] if "loss_bits" in steps[-1] else None, r["weights_sha256"][:12])
