"""Per step of each arm: the node's peak RSS (both ranks), each rank's, and the least memory available."""
import json, os, sys
HERE = os.path.dirname(os.path.abspath(__file__))
for arm in sys.argv[1:] or ["before", "at-once-only", "at-once-and-step-rise", "final", "stock-nvme"]:
    rows = [json.loads(line) for line in open(os.path.join(HERE, f"{arm}.rss.jsonl"))]
    ends = [float(line.split()[0]) for line in open(os.path.join(HERE, f"{arm}.out")) if " step " in line and " loss " in line]
    last = [line for line in open(os.path.join(HERE, f"{arm}.out")) if "in_memory_cgroup" in line]
    bounds = [rows[0][1]] + ends + ([rows[-1][1] + 1] if last and "OOM kills in its cgroup: 1" in last[-1] else [])
    print(arm, "|", last[-1].split("] ", 1)[1].strip() if last else "")
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        seg = [r for r in rows if a <= r[1] < b and r[3]]
        if not seg:
            continue
        peak = max(seg, key=lambda r: sum(v[0] for v in r[3].values()))
        print(f"  {f'step {k}' if k < len(ends) else 'after the last step line (killed)'}: node peak {sum(v[0] for v in peak[3].values()) / 1024:5.2f} GiB, "
              f"ranks {[round(v[0] / 1024, 2) for _, v in sorted(peak[3].items())]}, least available {min(r[2] for r in seg) / 1024:5.2f} GiB")
