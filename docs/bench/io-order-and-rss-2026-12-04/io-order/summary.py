import json, sys, glob, os
for path in sorted(glob.glob(sys.argv[1] + "/*.result.json"), key=os.path.getmtime):
    d = json.load(open(path)); st = d["steps"]
    m = [json.loads(l) for l in open(path.replace(".result.json", ".metrics.jsonl"))]
    print(os.path.basename(path).split(".")[0], "steps", [round(s["time_s"], 2) for s in st], "wait", [round(x["fetch_wait_s"], 2) for x in m],
          "peakRSS %.2f" % (st[-1]["peak_rss_bytes"] / 2**30), "loss", st[-1]["loss_bits"], "sha", d["weights_sha256"][:10] if d.get("weights_sha256") else None)
