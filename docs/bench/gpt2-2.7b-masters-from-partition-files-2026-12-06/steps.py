"""Per run (../phases-traced-2026-12-06/wrap.py traces): step times, forward / backward / update wall times (s), the
last loss, and per step the drive's bytes and the NVMe waits from the run's metrics. python steps.py old-1 new-1 ..."""
import gzip, json, sys
for arm in sys.argv[1:]:
    result = json.load(gzip.open(f"{arm}.result.json.gz"))
    phases = [(f[1], float(f[-2]), float(f[-1])) for f in (line.split() for line in gzip.open(f"{arm}.trace.gz", "rt"))
              if f[0] == "P" and f[1] in ("forward", "backward", "step")]
    rows = [f"{fw[2]-fw[1]:.1f}/{bw[2]-bw[1]:.1f}/{st[2]-st[1]:.1f}"
            for fw, bw, st in (phases[3 * i:3 * i + 3] for i in range(len(phases) // 3))]
    metrics = [json.loads(line) for line in open(f"{arm}.metrics.jsonl")]
    print(arm, "steps", [round(s["time_s"], 1) for s in result["steps"]], "forward/backward/update", rows,
          "loss", result["steps"][-1]["loss"])
    print("   read GB", [round(m["nvme_read_bytes"] / 1e9, 1) for m in metrics],
          "written GB", [round(m["nvme_write_bytes"] / 1e9, 1) for m in metrics],
          "optimizer wait s", [round(m["optimizer_nvme_wait_s"], 1) for m in metrics],
          "parameter wait s", [round(m["param_nvme_wait_s"], 1) for m in metrics])
