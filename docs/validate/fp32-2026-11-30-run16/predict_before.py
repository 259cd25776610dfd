"""Run 16's configurations predicted by the model before the thirty-ninth session (5cd396d: one queue per direction,
or one for both where the mixed rate is at most the harmonic mean of the two rates), on run 16's own machine files.
Run from the root of a worktree at 5cd396d (its code is the one imported):
python /path/to/predict_before.py RUN_FOLDER OUT.json"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "docs", "validate"))
import recompute as r  # noqa: E402

folder, out = sys.argv[1], sys.argv[2]
result = {}
for name, p in r.predictions(folder).items():
    again = r.predicted_again(r.machine_for(folder, p["model"]), p)
    result[name] = {arm: again[arm]["step_time_s"] for arm in ("stock", "tencache")}
with open(out, "w") as handle:
    json.dump({"code": "5cd396d", "predictions": result}, handle, indent=1)
print(json.dumps(result, indent=1))
