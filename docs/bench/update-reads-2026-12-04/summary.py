"""Medians of steps 3-9 per run (counted from 0: steps 4-10 counted from 1) (step time, parameter NVMe wait, NVMe bytes), per shape and arm; loss bits and
weights digests compared across the arms of a shape."""
import glob, json, os, statistics, sys
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))  # the repository: its result files are archived here
from tencache_ds.bench.records import read_json_record, record_exists
out = sys.argv[1] if len(sys.argv) > 1 else HERE
rows, summary = {}, {}
for path in sorted(glob.glob(f"{out}/*.metrics.jsonl")):
    tag = os.path.basename(path)[:-len(".metrics.jsonl")]
    shape, arm, rep = tag.split("-")
    lines = [json.loads(line) for line in open(path)][3:]
    if not lines:
        continue
    med = lambda key: statistics.median(line[key] for line in lines)
    result_path = f"{out}/{tag}.result.json"
    result = read_json_record(result_path) if record_exists(result_path) else {}
    steps = result.get("steps", [])
    bits = tuple(step.get("loss_bits") for step in steps)
    stats = steps[-1]["stats"] if steps else {}
    row = dict(step_s=med("step_time_s"), param_wait_s=med("param_nvme_wait_s"), fetch_wait_s=med("fetch_wait_s"),
               read_gb=med("nvme_read_bytes") / 1e9, write_gb=med("nvme_write_bytes") / 1e9,
               update_reads=stats.get("param_update_reads"), weights=result.get("weights_sha256"), bits=hash(bits))
    rows.setdefault((shape, arm), []).append(row)
    print(f"{tag:12s} step {row['step_s']:.3f} s  param wait {row['param_wait_s']:.3f} s  fetch wait "
          f"{row['fetch_wait_s']:.3f} s  read/write {row['read_gb']:.3f}/{row['write_gb']:.3f} GB  update reads "
          f"{row['update_reads']}  weights {str(row['weights'])[:12]}")
for shape in sorted({shape for shape, _arm in rows}):
    old, new = rows.get((shape, "old"), []), rows.get((shape, "new"), [])
    if not old or not new:
        continue
    m = lambda rs, key: statistics.median(r[key] for r in rs)
    same = len({r["weights"] for r in old + new}) == 1 and len({r["bits"] for r in old + new}) == 1
    summary[shape] = dict(old_step_s=m(old, "step_s"), new_step_s=m(new, "step_s"),
                          ratio=m(new, "step_s") / m(old, "step_s"), old_param_wait_s=m(old, "param_wait_s"),
                          new_param_wait_s=m(new, "param_wait_s"), runs=len(old) + len(new), identical=same)
    print(shape, json.dumps(summary[shape]))
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
