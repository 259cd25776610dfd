"""What run 27's tencache steps lost beside the drive, from the runs' own metrics: each budget's step less its NVMe
waits (its compute and tencache's own CPU work) against `"auto"`'s (no NVMe bytes), over the drive's busy seconds
beside that compute (busy less the waits). An upper bound of the drive's cost to the cores as the steps felt it: the
difference holds tencache's own streaming work too, which the step model prices apart. Run from the repository root:

    python docs/validate/reprice-all-2026-12-05/felt_contention.py > docs/validate/reprice-all-2026-12-05/felt_contention.txt
"""
import json
import os
import statistics

RUN = "docs/validate/fp32-2026-12-05-run27-profiled"
WARMUP = 3  # the run's --warmup

for model in ("gpt2-tiny", "gpt2-small", "gpt2-medium"):
    medians = {}
    for budget in ("auto", "quarter", "stream"):
        with open(os.path.join(RUN, f"{model}-{budget}", "tencache-1.metrics.jsonl")) as handle:
            steps = [json.loads(line) for line in handle][WARMUP:]
        medians[budget] = {key: statistics.median(fn(step) for step in steps) for key, fn in (
            ("step", lambda step: step["step_time_s"]), ("wait", lambda step: step["fetch_wait_s"]),
            ("busy", lambda step: step["nvme_busy_fraction"] * step["step_time_s"]))}
    alone = medians["auto"]["step"] - medians["auto"]["wait"]
    for budget in ("quarter", "stream"):
        m = medians[budget]
        beside = m["busy"] - m["wait"]
        lost = m["step"] - m["wait"] - alone
        print(f"{model} {budget}: step {m['step']:.3f} s, waits {m['wait']:.3f} s, the rest {m['step'] - m['wait']:.3f} s "
              f"against auto's {alone:.3f} s (+{lost:.3f} s); drive busy {m['busy']:.3f} s, {beside:.3f} s of it "
              f"beside the rest: {lost / beside if beside > 0 else float('nan'):.2f} s lost a busy second")
