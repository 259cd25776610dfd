import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/*.result.json")):
    r = json.load(open(f)); st = r["steps"]
    print(os.path.basename(f)[:-12], "steps", [round(s["time_s"], 2) for s in st], "peak RSS GiB", round(max(s["peak_rss_bytes"] for s in st) / 2**30, 3),
          "at-once", st[-1]["stats"].get("gradients_partitioned_at_once"), "loss bits", [s["loss_bits"] for s in st][-2:], "sha", r["weights_sha256"][:12] if r.get("weights_sha256") else None)
