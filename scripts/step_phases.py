"""Host time per phase of a training step, for any arm: wraps the engine's forward/backward/step, stage 3's step
phases, the parameter coordinator and (when importable) tencache's swappers and store calls with perf_counter, runs
scripts/train.py in this process, drops the warm-up steps, and prints and writes per-step means at exit.

    python3 scripts/step_phases.py LABEL OUT.json -- scripts/train.py ARGS...
    deepspeed --num_gpus 1 scripts/step_phases.py LABEL OUT.json -- scripts/train.py ARGS...   # as the bench runs

It replaces sampling profilers where they failed: cProfile on Python >= 3.12 charges other threads' waits to the
training thread, and py-spy --native slowed a gpt2-small step tenfold and could not merge stock's frames (H200,
docs/gpu_check.md). ``STEP_PHASES_SYNC=1`` waits for the GPU at the end of each step, so that every step's device
work is charged to it (on the H200 that wait took stock CPU offload 0.3 ms a step); off by default. With the
launcher or without, the step is the same (the fifth lease). ``STEP_PHASES_WARMUP`` (default 2) steps are dropped.
A step is an optimizer step (with gradient accumulation, several micro-batches); with several ranks, rank N
writes OUT.rankN.json beside OUT.json. ``STEP_PHASES_DETAIL=1`` also wraps every method of tencache's coordinator, swappers, entry store and memory-pressure
governor, the coordinator's gather and release, and stage 3's per-gradient offload.
Times are the host's: a phase that waits for the GPU is charged the wait. Each phase also gets the training thread's
CPU time in it (``cpu_ms_per_step``; the rest of its wall time is waiting: for the GPU, a lock, the GIL or a core), and
each thread of the process its CPU time over the measured steps and its time runnable but waiting for a core
(``thread_cpu``, from /proc/self/task/*/schedstat; torch's and OpenMP's workers are named ``python3`` there).
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
CPU = collections.defaultdict(float)  # the calling thread's CPU time in each phase: wall minus this is waiting
N = collections.Counter()
STEPS = int(script_args[script_args.index("--steps") + 1]) if "--steps" in script_args else None
# done: after the last step (what the script does then, hashing the weights, is not a step)
STATE = {"steps": 0, "threads": None, "done": False, "t0": time.perf_counter()}


def wrap(cls, name, tag=None):
    fn = getattr(cls, name, None)
    if fn is None:
        print(f"[phases] no {cls.__name__}.{name}", flush=True)
        return
    if getattr(fn, "_step_phases", False):  # wrapped already (STEP_PHASES_DETAIL's pass): counted once
        return
    tag = tag or f"{cls.__name__}.{name}"

    @functools.wraps(fn)
    def inner(*a, **k):
        t, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            if not STATE["done"]:
                T[tag] += time.perf_counter() - t
                CPU[tag] += time.thread_time() - c
                N[tag] += 1
    inner._step_phases = True
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
    if os.environ.get("STEP_PHASES_DETAIL") == "1":
        # every method of the classes the fetch path and the step go through, under their own names (nested calls
        # count in each: a row is inclusive), to find where the GPU's extra fetch and step time goes
        import tencache_ds.integrations.deepspeed.param_swapper as param_swapper_module
        from tencache_ds.integrations.deepspeed.coordinator import TencacheCoordinator
        from tencache_ds.cache.entry_store import EntryStore
        from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
        from tencache_ds.integrations.deepspeed.memory_pressure import HostTierGovernor
        for cls in (TencacheCoordinator, P, O, EntryStore, HostTierGovernor):
            for n, fn in list(vars(cls).items()):
                if callable(fn) and not isinstance(fn, classmethod) and not n.startswith("__"):
                    wrap(cls, n)
        for n in ("all_gather_params", "release_param", "prefetch_nvme_param_partitions"):
            wrap(C, "_PartitionedParameterCoordinator__" + n)
        wrap(DeepSpeedZeRoOffload, "partition_all_parameters")
        for n in ("_offload_grad_partition_at_boundary", "_constant_buffered_norm2", "reset_cpu_buffers",
                  "invalidate_secondary_tensor", "_loss_scale_update_and_overflow_cleanup"):
            wrap(S3, n)
        _fence = param_swapper_module._device_copy_fence

        def timed_fence(*args, **kwargs):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return _fence(*args, **kwargs)
            finally:
                if not STATE["done"]:
                    T["param_swapper._device_copy_fence"] += time.perf_counter() - t
                    CPU["param_swapper._device_copy_fence"] += time.thread_time() - c
                    N["param_swapper._device_copy_fence"] += 1
        param_swapper_module._device_copy_fence = timed_fence
except ImportError as exc:
    print(f"[phases] no tencache_ds: {exc}", flush=True)

_engine_step = DeepSpeedEngine.step


def thread_times():
    """{tid: (name, ns on a CPU, ns waiting for one)} of this process's threads (/proc/self/task/*/schedstat): whether
    a phase's waiting is for a CPU (threads outnumbering the cores) or for something else (the GPU, a lock, the GIL);
    Python threads are named by threading's names, others by their kernel name."""
    import threading
    py_names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_ns, wait_ns = (int(v) for v in f.read().split()[:2])
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # the thread ended between listdir and open
            continue
        out[int(tid)] = (py_names.get(int(tid), comm), run_ns, wait_ns)
    return out


def counted_step(self, *a, **k):
    # a step is an optimizer step: with gradient accumulation engine.step() is called every micro-batch and
    # updates at the window's boundary only, which moves global_steps on (with "managed_gradient_accumulation":
    # false the caller's step() is the boundary, which is_gradient_accumulation_boundary() says only during it)
    global_steps = self.global_steps
    t, c = time.perf_counter(), time.thread_time()
    try:
        result = _engine_step(self, *a, **k)
    finally:
        if SYNC and torch.cuda.is_available():
            torch.cuda.synchronize()
        tag = "DeepSpeedEngine.step+sync" if SYNC else "DeepSpeedEngine.step"
        T[tag] += time.perf_counter() - t
        CPU[tag] += time.thread_time() - c
        N[tag] += 1
    if self.global_steps != global_steps:
        STATE["steps"] += 1
        STATE["threads"] = torch.get_num_threads()
        STATE["t_last"] = time.perf_counter()
        STATE["done"] = STATE["steps"] == STEPS
        if STATE["done"]:
            STATE["threads1"] = thread_times()
            report()  # now, not only at exit: a launcher's SIGTERM on a timeout skips exit handlers
        if STATE["steps"] == WARMUP:
            T.clear()
            CPU.clear()
            N.clear()
            STATE["threads0"] = thread_times()
            STATE["t0"] = time.perf_counter()
    return result


DeepSpeedEngine.step = counted_step


@atexit.register
def report():
    steps = STATE["steps"] - WARMUP
    if steps <= 0 or STATE.get("reported"):
        return
    STATE["reported"] = True
    wall = STATE["t_last"] - STATE["t0"]  # the measured steps only, not what the script does after them
    rows = {k: {"ms_per_step": 1000 * v / steps, "cpu_ms_per_step": 1000 * CPU[k] / steps,
                "calls_per_step": N[k] / steps} for k, v in T.items()}
    # per thread over the measured steps (threads started after the warm-up count from 0): ms on a CPU and ms
    # runnable but waiting for one, per step; by name, summed over threads of the same name
    before, after = STATE.get("threads0", {}), STATE.get("threads1", {})
    per_name = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for tid, (name, run_ns, wait_ns) in after.items():
        _n, run0, wait0 = before.get(tid, (name, 0, 0))
        row = per_name["main" if tid == os.getpid() else name]
        row[0] += 1
        row[1] += (run_ns - run0) / 1e6 / steps
        row[2] += (wait_ns - wait0) / 1e6 / steps
    thread_rows = {name: {"threads": n, "cpu_ms_per_step": round(run, 2), "runqueue_ms_per_step": round(wait, 2)}
                   for name, (n, run, wait) in sorted(per_name.items(), key=lambda kv: -kv[1][1]) if run >= 0.05}
    result = {"label": label, "steps": steps, "wall_ms_per_step": 1000 * wall / steps, "threads": STATE["threads"],
              "synchronized": SYNC, "phases": rows, "thread_cpu": thread_rows}
    rank = os.environ.get("RANK", "0")  # several ranks: rank 0 writes OUT, rank N OUT with .rankN before its suffix
    base, suffix = os.path.splitext(out)
    with open(out if rank == "0" else f"{base}.rank{rank}{suffix}", "w") as f:
        json.dump(result, f, indent=1)
    print(f"[phases] {label}: {steps} steps, {1000 * wall / steps:.1f} ms/step, threads {STATE['threads']}")
    for k, r in sorted(rows.items(), key=lambda kv: -kv[1]["ms_per_step"]):
        print(f"[phases]   {k:70s} {r['ms_per_step']:9.1f} ms  cpu {r['cpu_ms_per_step']:7.1f}  "
              f"x{r['calls_per_step']:.0f}")
    for name, r in thread_rows.items():
        print(f"[phases]   thread {name:40s} x{r['threads']:<3d} cpu {r['cpu_ms_per_step']:8.1f} ms  runqueue "
              f"{r['runqueue_ms_per_step']:7.1f} ms")


sys.path.insert(0, os.path.dirname(os.path.abspath(script_args[0])))
sys.argv = script_args
runpy.run_path(script_args[0], run_name="__main__")
