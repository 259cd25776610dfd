"""Run 16's configurations predicted by the model before the thirty-ninth session (5cd396d: one queue per direction,
or one for both on a drive that does not add them), on run 16's own machine files. Run from a worktree at 5cd396d:
python /path/to/before.py RUN_FOLDER OUT.json"""
import json, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "docs", "validate"))
import recompute as r
folder, out = sys.argv[1], sys.argv[2]
result = {}
for name, p in r.predictions(folder).items():
    again = r.predicted_again(r.machine_for(folder, p["model"]), p)
    result[name] = {arm: again[arm]["step_time_s"] for arm in ("stock", "tencache")}
json.dump({"code": "5cd396d", "predictions": result}, open(out, "w"), indent=1)
print(json.dumps(result, indent=1))
