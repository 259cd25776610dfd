"""Per step of each trace (../phases-traced-2026-12-06/wrap.py): the step's time, its forward / backward / update
wall times, and the parameter reads the prefetch schedule had started by then (cumulative stats)."""
import gzip, json, sys
for path in sys.argv[1:]:
    result = json.load(gzip.open(path.replace(".trace.gz", ".result.json.gz")))
    phases = [(f[1], float(f[-2]), float(f[-1])) for f in (line.split() for line in gzip.open(path, "rt"))
              if f[0] == "P" and f[1] in ("forward", "backward", "step")]
    rows = [f"{fw[2]-fw[1]:.1f}/{bw[2]-bw[1]:.1f}/{st[2]-st[1]:.1f}"
            for fw, bw, st in (phases[3 * i:3 * i + 3] for i in range(len(phases) // 3))]
    print(path, "steps (s):", [round(s["time_s"], 1) for s in result["steps"]], "forward/backward/update:", rows,
          "scheduled reads so far:", [(s.get("stats") or {}).get("param_scheduled_reads") for s in result["steps"]])
