"""Medians over steps >= FIRST of each phase's wall time, CPU and minor faults, per trace; and the loss bits."""
import sys, statistics, json, os, gzip
first = int(os.environ.get("FIRST", "3"))
for path in sys.argv[1:]:
    rows = {"forward": [], "backward": [], "step": []}
    for line in (gzip.open(path, "rt") if path.endswith(".gz") else open(path)):
        f = line.split()
        if f[0] == "P" and f[1] in rows and len(f) == 5:
            d = dict(kv.split("=") for kv in f[2].split(","))
            rows[f[1]].append((float(f[4]) - float(f[3]), float(d["cpu"]), int(d["minflt"])))
    out = []
    for k, v in rows.items():
        v = v[first:]
        if v:
            out.append(f"{k} {statistics.median(x[0] for x in v):.2f}s cpu {statistics.median(x[1] for x in v):.2f} flt {statistics.median(x[2] for x in v)/1e6:.2f}M (n={len(v)})")
    res = path.replace(".trace", ".result.json").replace(".json.gz", ".json")
    extra = ""
    if os.path.exists(res) or os.path.exists(res + ".gz"):
        r = json.load(open(res)) if os.path.exists(res) else json.load(gzip.open(res + ".gz")); st = r["steps"]
        extra = f" | steps {statistics.median(s['time_s'] for s in st[first:]):.2f}s peak {max(s['peak_rss_bytes'] for s in st)/2**30:.2f}GiB bits {st[-1]['loss_bits']}"
    print(os.path.basename(path), " | ".join(out), extra)
