"""Host time per phase of a training step, for any arm: wraps the engine's forward/backward/step, stage 3's step
phases, the parameter coordinator and (when importable) tencache's swappers and store calls with perf_counter, runs
scripts/train.py in this process, drops the warm-up steps, and prints and writes per-step means at exit.

    python3 scripts/step_phases.py LABEL OUT.json -- scripts/train.py ARGS...
    deepspeed --num_gpus 1 scripts/step_phases.py LABEL OUT.json -- scripts/train.py ARGS...   # as the bench runs

It replaces sampling profilers where they failed: cProfile on Python >= 3.12 charges other threads' waits to the
training thread, and py-spy --native slowed a gpt2-small step tenfold and could not merge stock's frames (H200,
docs/gpu_check.md). ``STEP_PHASES_SYNC=1`` waits for the GPU at the end of each step, so that every step's device
work is charged to it (on the H200 that wait took stock CPU offload 0.3 ms a step; its step there, 0.275 s without
the launcher, against the bench's 0.19-0.20 s under it, is not explained yet); off by default. ``STEP_PHASES_WARMUP`` (default 2) steps are dropped.
Times are the host's: a phase that waits for the GPU is charged the wait.
"""
import atexit
import collections
import functools
import json
import os
import runpy
import sys
import time

# the deepspeed launcher puts --local_rank=N first: dropped here (the launcher also sets LOCAL_RANK, which
# scripts/train.py reads)
ARGV = [a for a in sys.argv if not a.startswith(("--local_rank", "--local-rank"))]
if len(ARGV) < 5 or ARGV[3] != "--":
    sys.exit(__doc__)
label, out = ARGV[1], ARGV[2]
script_args = ARGV[4:]
WARMUP = int(os.environ.get("STEP_PHASES_WARMUP", "2"))
SYNC = os.environ.get("STEP_PHASES_SYNC") == "1"
T = collections.defaultdict(float)
N = collections.Counter()
STEPS = int(script_args[script_args.index("--steps") + 1]) if "--steps" in script_args else None
# done: after the last step (what the script does then, hashing the weights, is not a step)
STATE = {"steps": 0, "threads": None, "done": False, "t0": time.perf_counter()}


def wrap(cls, name, tag=None):
    fn = getattr(cls, name, None)
    if fn is None:
        print(f"[phases] no {cls.__name__}.{name}", flush=True)
        return
    tag = tag or f"{cls.__name__}.{name}"

    @functools.wraps(fn)
    def inner(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            if not STATE["done"]:
                T[tag] += time.perf_counter() - t
                N[tag] += 1
    setattr(cls, name, staticmethod(inner) if isinstance(cls.__dict__.get(name), staticmethod) else inner)


import torch  # noqa: E402
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as S3  # noqa: E402

for n in ("forward", "backward"):
    wrap(DeepSpeedEngine, n)
for n in ("step", "_pre_step", "_partition_all_parameters", "_overflow_check_and_loss_scale_update",
          "_get_norm_groups", "_prepare_sub_group", "unscale_and_clip_grads", "_optimizer_step",
          "_reassign_or_swap_out_partitioned_parameters", "_release_sub_group", "_post_step", "partition_grads",
          "_swap_out_offload_fp32_gradients",
          "_partitioned_params_swap_out", "_optimizer_states_and_gradient_swap_in",
          "_optimizer_states_and_gradient_swap_out", "_unflatten_partitioned_parameters", "zero_grad",
          "independent_gradient_partition_epilogue", "_finalize_offload_gradient_accumulation"):
    wrap(S3, n)
try:
    from tencache_ds.cache.write_back import WriteBack
    from tencache_ds.cache.transfers import Transfers
    wrap(WriteBack, "store")
    wrap(WriteBack, "write_parts")
    wrap(Transfers, "fence")
    from tencache_ds.integrations.deepspeed.optimizer_swapper import TencacheOptimizerSwapper as O
    from tencache_ds.integrations.deepspeed.param_swapper import TencacheParamSwapper as P
    for n in ("swap_in_optimizer_state", "swap_out_optimizer_state", "swap_out_gradients", "pre_backward"):
        wrap(O, n)
    for n in ("swap_in", "swap_out_and_release", "synchronize_reads", "swap_out_partitioned_params",
              "end_optimizer_step", "remove_partition_and_release_buffers"):
        wrap(P, n)
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as C
    for n in ("fetch_sub_module", "release_sub_module", "reset_step"):
        wrap(C, n)
except ImportError as exc:
    print(f"[phases] no tencache_ds: {exc}", flush=True)

_engine_step = DeepSpeedEngine.step


def counted_step(self, *a, **k):
    t = time.perf_counter()
    try:
        return _engine_step(self, *a, **k)
    finally:
        if SYNC and torch.cuda.is_available():
            torch.cuda.synchronize()
        T["DeepSpeedEngine.step+sync" if SYNC else "DeepSpeedEngine.step"] += time.perf_counter() - t
        STATE["steps"] += 1
        STATE["threads"] = torch.get_num_threads()
        STATE["t_last"] = time.perf_counter()
        STATE["done"] = STATE["steps"] == STEPS
        if STATE["done"]:
            report()  # now, not only at exit: a launcher's SIGTERM on a timeout skips exit handlers
        if STATE["steps"] == WARMUP:
            T.clear()
            N.clear()
            STATE["t0"] = time.perf_counter()


DeepSpeedEngine.step = counted_step


@atexit.register
def report():
    steps = STATE["steps"] - WARMUP
    if steps <= 0 or STATE.get("reported"):
        return
    STATE["reported"] = True
    wall = STATE["t_last"] - STATE["t0"]  # the measured steps only, not what the script does after them
    rows = {k: {"ms_per_step": 1000 * v / steps, "calls_per_step": N[k] / steps} for k, v in T.items()}
    result = {"label": label, "steps": steps, "wall_ms_per_step": 1000 * wall / steps, "threads": STATE["threads"],
              "synchronized": SYNC, "phases": rows}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"[phases] {label}: {steps} steps, {1000 * wall / steps:.1f} ms/step, threads {STATE['threads']}")
    for k, r in sorted(rows.items(), key=lambda kv: -kv[1]["ms_per_step"]):
        print(f"[phases]   {k:70s} {r['ms_per_step']:9.1f} ms  x{r['calls_per_step']:.0f}")


sys.path.insert(0, os.path.dirname(os.path.abspath(script_args[0])))
sys.argv = script_args
runpy.run_path(script_args[0], run_name="__main__")
