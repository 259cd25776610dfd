"""Every prospective fp32 run from run 13 on, priced again by this tree's code (scripts/validate_estimate.py's
``reprice``, from each run's profiles where it took them), with each model's calibrated ``io_contention`` scaled by
1 (as calibrated), 0 and 0.5: rows within 15% per run and in all; then, with the term as calibrated, each kind of
row's median error and range over the runs. Run from the repository root:

    python docs/validate/reprice-all-2026-12-05/reprice_all.py > docs/validate/reprice-all-2026-12-05/output.txt
"""
import collections
import contextlib
import dataclasses
import glob
import importlib.util
import io
import os
import statistics
import sys

REPO = os.getcwd()
sys.path[:0] = [REPO, os.path.join(REPO, "scripts")]
spec = importlib.util.spec_from_file_location("validate_estimate", os.path.join(REPO, "scripts", "validate_estimate.py"))
ve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ve)
load_machine = ve.load_machine
SCALES = (1.0, 0.0, 0.5)
FOLDERS = sorted(folder for folder in glob.glob("docs/validate/fp32-2026-1*-run*/")
                 if int(folder.split("run")[1].split("-")[0].rstrip("/")) >= 13)


def errors(folder, scale):
    """[(configuration, arm, predicted / measured - 1)] of the folder, priced with io_contention x scale."""
    ve.load_machine = lambda path: dataclasses.replace(load_machine(path),
                                                       io_contention=load_machine(path).io_contention * scale)
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        rows, _ = ve.reprice(folder, "profiled")
    return [(row["name"], row["arm"], row["repriced"]["step_time_s"] / row["measured"]["step_time_s"] - 1)
            for row in rows if row["measured"].get("step_time_s")]


within = lambda found: sum(abs(error) <= 0.15 for *_, error in found)
totals, kinds, rows = collections.Counter(), collections.defaultdict(list), 0
print("run: rows within 15% with io_contention x " + ", x ".join(f"{scale:g}" for scale in SCALES))
for folder in FOLDERS:
    found = {scale: errors(folder, scale) for scale in SCALES}
    rows += len(found[1.0])
    for scale in SCALES:
        totals[scale] += within(found[scale])
    print(f"{os.path.basename(folder.rstrip('/'))}: {len(found[1.0])} rows, "
          + ", ".join(str(within(found[scale])) for scale in SCALES))
    for name, arm, error in found[1.0]:
        model, budget = name.rsplit("-", 1)
        kinds[(model, "stock" if arm == "stock" else f"tencache {budget}")].append(error)
print(f"all: {rows} rows, " + ", ".join(str(totals[scale]) for scale in SCALES))
print("\nkind of row (io_contention as calibrated): rows, median error, range, within 15%")
for (model, kind), found in sorted(kinds.items()):
    print(f"{model} {kind}: {len(found)}, {statistics.median(found):+.0%}, {min(found):+.0%} to {max(found):+.0%}, "
          f"{sum(abs(error) <= 0.15 for error in found)}")
