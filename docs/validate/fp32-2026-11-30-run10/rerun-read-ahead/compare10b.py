"""Run 10's saved predictions (docs/validate/fp32-2026-11-30-run10/predictions.json) against the reruns of
rerun10.sh: python compare10b.py NAME... (OUT: the reruns' folder; default, this one)."""
import json, sys, os
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 4)); sys.path[:0] = [os.path.join(REPO, "scripts"), REPO]
import validate_estimate as v
from tencache_ds.bench.records import record_exists
pred = json.load(open(os.path.join(REPO, "docs/validate/fp32-2026-11-30-run10/predictions.json")))["predictions"]
rows = []
for name in sys.argv[1:]:
    folder = os.path.join(os.environ.get("OUT", os.path.dirname(os.path.abspath(__file__))), name)
    if not record_exists(folder + "/bench.json"):  # archived as bench.json.gz
        continue
    measured = v.measured_from_bench(folder)
    for arm, values in measured["arms"].items():
        rows.append({"name": name, "arm": arm, "predicted": pred[name]["predicted"][arm], "measured": values})
print(v.table(rows))
