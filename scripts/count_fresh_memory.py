"""How much fresh host memory each phase of a training step writes: minor page faults (each a 4 KiB page touched for
the first time since it was mapped) during the engine's forward, backward and step, per call, in MiB. Runs
scripts/train.py in this process. On a host accelerator stage 3's backward allocates its gradients and reduce
buckets afresh every micro-batch, and the step model charges that at the machine's first-touch write rate
(plan/step_model/costs.py, BACKWARD_FRESH_BYTES_PER_GATHERED_BYTE, which these counts gave). The faults of stage 3's
clipping norms (``_constant_buffered_norm2``, inside the backward) are also reported apart, per backward ("norm"):
the model prices their float64 copies by size (costs.py, ``norm_fresh_elements``).

    python3 scripts/count_fresh_memory.py scripts/train.py --model gpt2-tiny --dtype fp32 --steps 4 ...
"""
import atexit
import collections
import os
import runpy
import sys

if len(sys.argv) < 2:
    sys.exit(__doc__)
SCRIPT_ARGS = sys.argv[1:]
PAGE = os.sysconf("SC_PAGE_SIZE")
CALLS = []  # (phase, faults)


def minor_faults() -> int:
    with open("/proc/self/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])  # field 10, minflt


def counted(method, phase):
    def inner(self, *args, **kwargs):
        before = minor_faults()
        try:
            return method(self, *args, **kwargs)
        finally:
            CALLS.append((phase, minor_faults() - before))
            if phase == "step":  # as it goes too: a process that ends without running atexit (gpt2-medium's did)
                report()
    return inner


from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3  # noqa: E402

for name in ("forward", "backward", "step"):
    setattr(DeepSpeedEngine, name, counted(getattr(DeepSpeedEngine, name), name))
# inside backward (counted there too): the float64 copies of stage 3's clipping norm, which the step model prices
# apart (costs.py, norm_fresh_elements): one call per gradient partition, summed per backward at report time (with
# gradient accumulation the engine manages; where a script calls the optimizer step itself, the norms run in step and
# are reported with the next backward)
setattr(DeepSpeedZeroOptimizer_Stage3, "_constant_buffered_norm2",
        counted(DeepSpeedZeroOptimizer_Stage3._constant_buffered_norm2, "norm"))


@atexit.register
def report():
    per_phase = collections.defaultdict(list)
    norm = 0
    for phase, faults in CALLS:
        if phase == "norm":  # the norms of one backward, reported with it
            norm += faults
            continue
        if phase == "backward":
            per_phase["norm"].append(norm * PAGE / 2**20)
            norm = 0
        per_phase[phase].append(faults * PAGE / 2**20)
    for phase, mib in per_phase.items():
        print(f"[fresh memory] {phase:8s} MiB per call: " + " ".join(f"{value:.0f}" for value in mib), flush=True)


sys.path.insert(0, os.path.dirname(os.path.abspath(SCRIPT_ARGS[0])))
sys.argv = SCRIPT_ARGS
runpy.run_path(SCRIPT_ARGS[0], run_name="__main__")
