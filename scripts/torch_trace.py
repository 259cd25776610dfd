"""A torch.profiler trace (host and CUDA) of a few steps of any arm, launched as the bench launches it:

    TORCH_TRACE_OUT=DIR TORCH_TRACE_LABEL=tencache deepspeed --num_gpus 1 scripts/torch_trace.py scripts/train.py ARGS

Runs scripts/train.py in this process; profiles the steps from ``TORCH_TRACE_START`` (default 6, counted from 0;
the step before it pays for starting the profiler) for ``TORCH_TRACE_STEPS`` (default 2), and writes into DIR: LABEL.ops.txt (the ops by host self time, by device
self time, and the CUDA runtime calls that can wait, grouped by the Python stack that made them where torch records
one), LABEL.summary.json (the window's wall time per step, the device's busy time per step as the union of its
kernels and copies, the host's time in runtime calls that can wait for the device) and LABEL.trace.json.gz (the Chrome trace). Steps outside the window run unprofiled,
so the result file's step times there are the arm's own.

Why: on the H200 the per-phase host times (scripts/step_phases.py) summed to 1.13x stock CPU offload's step while
the bench measured 1.65x (docs/gpu_check.md): where the host waits for the device, and the device for the host,
needs the device's own timeline.
"""
import gzip
import json
import os
import runpy
import shutil
import sys
import time

import torch
from deepspeed.runtime.engine import DeepSpeedEngine

OUT = os.environ.get("TORCH_TRACE_OUT", "torch-trace")
LABEL = os.environ.get("TORCH_TRACE_LABEL", "arm")
START = int(os.environ.get("TORCH_TRACE_START", "6"))
COUNT = int(os.environ.get("TORCH_TRACE_STEPS", "2"))
# runtime calls in which the host can wait for the device: synchronisations, copies (a cudaMemcpyAsync waits when
# either side is pageable memory), and calls that synchronise implicitly (registering, freeing)
CAN_WAIT = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
            "cudaMemcpyAsync", "cudaHostRegister", "cudaHostUnregister", "cudaFree", "cudaMalloc", "cudaHostAlloc",
            "cudaFreeHost")
if START < 1 or COUNT < 1:
    sys.exit(f"torch_trace: TORCH_TRACE_START ({START}) and TORCH_TRACE_STEPS ({COUNT}) must be at least 1")
STATE = {"steps": 0, "prof": None, "t0": None}


def _activities():
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def _union_us(intervals):
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def _table(averages, key, limit):
    try:
        return averages.table(sort_by=key, row_limit=limit, max_name_column_width=80)
    except (AttributeError, KeyError, ValueError) as exc:
        return f"(no table by {key}: {exc})"


def _report(prof, wall_s):
    os.makedirs(OUT, exist_ok=True)
    events = prof.events()
    device = [(e.time_range.start, e.time_range.end) for e in events
              if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)]
    waiting = {}
    for e in events:
        if e.name in CAN_WAIT:
            waiting[e.name] = waiting.get(e.name, 0.0) + e.cpu_time_total
    summary = {"label": LABEL, "steps": COUNT, "wall_ms_per_step": 1000 * wall_s / COUNT,
               "device_busy_ms_per_step": _union_us(device) / 1000 / COUNT,
               "device_events": len(device),
               "calls_that_can_wait_ms_per_step": {k: v / 1000 / COUNT for k, v in sorted(waiting.items())}}
    with open(os.path.join(OUT, f"{LABEL}.summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    averages = prof.key_averages()
    with open(os.path.join(OUT, f"{LABEL}.ops.txt"), "w") as f:
        f.write(json.dumps(summary, indent=1) + "\n\n")
        f.write("== by host self time\n" + _table(averages, "self_cpu_time_total", 45) + "\n")
        f.write("== by device self time\n" + _table(averages, "self_device_time_total", 30) + "\n")
        try:
            stacked = prof.key_averages(group_by_stack_n=6)
            rows = [a for a in stacked if a.key in CAN_WAIT]
            rows.sort(key=lambda a: -a.cpu_time_total)
            f.write("== runtime calls that can wait for the device, by Python stack (host ms per step)\n")
            for a in rows[:25]:
                f.write(f"{a.cpu_time_total / 1000 / COUNT:9.2f} ms x{a.count / COUNT:.0f}  {a.key}\n")
                for frame in (a.stack or [])[:6]:
                    f.write(f"            {frame}\n")
        except (AttributeError, RuntimeError) as exc:
            f.write(f"(no stacks: {exc})\n")
    raw = os.path.join(OUT, f"{LABEL}.trace.json")
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(raw)
    print(f"[torch_trace] {LABEL}: {json.dumps(summary)}", flush=True)


_engine_step = DeepSpeedEngine.step


def traced_step(self, *a, **k):
    try:
        return _engine_step(self, *a, **k)
    finally:
        STATE["steps"] += 1
        if STATE["steps"] == START:
            STATE["prof"] = torch.profiler.profile(activities=_activities(), with_stack=True)
            STATE["prof"].__enter__()
            STATE["t0"] = time.perf_counter()
        elif STATE["prof"] is not None and STATE["steps"] == START + COUNT:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall = time.perf_counter() - STATE["t0"]
            prof, STATE["prof"] = STATE["prof"], None
            try:  # the trace is a by-product: a failure to write it must not end the training run
                prof.__exit__(None, None, None)
                _report(prof, wall)
            except Exception as exc:  # pylint: disable=broad-except
                print(f"[torch_trace] {LABEL}: no trace: {type(exc).__name__}: {exc}", flush=True)


DeepSpeedEngine.step = traced_step

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank") and not a.startswith("--local-rank")]
    if not args:
        sys.exit(__doc__)
    sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
