"""Host memory through a training run's phases, sampled: runs scripts/train.py's main in this process (its arguments,
unchanged) while a thread reads the resident set (/proc/self/statm) every 2 ms, and records the peak of each phase
of each step (initialisation, forward, backward, the optimizer step, and the gaps between them) and, during the
optimizer steps, every change of 40 MiB (a rise or a fall) with the training thread's stack at that moment. A step
here is a call of ``engine.step``: one a micro-batch, so at gradient accumulation above 1 the optimizer's update is
in the boundary's call only. What showed that
tencache's streaming runs peak in their first update, where Adam creates its moments beside what the first backward
left (plan/step_model/tencache.py ``_first_update_optimizer_bytes``; docs/estimate.md, "The first update's memory").
scripts/measure_host_rest.py records the same process's memory between steps only, with glibc's heap.

    python scripts/sample_step_rss.py --deepspeed_config configs/stock-nvme.json --model gpt2-small --steps 3 \\
        --micro-batch 2 --seq-len 64 --nvme-path DIR --weights-gather none --dtype fp32 \\
        --tencache-block '{"enabled": true, "host_cache_bytes": 0, "device_cache_bytes": 0}'

Writes ``$STEP_RSS_OUT`` (default ``step-rss.json``): {"peaks": {"STEP:PHASE": bytes}, "changes": [[step, bytes,
stack], ...]}, and prints both. One rank (the sampler reads this process only). Linux.
"""
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30
SAMPLE_S = 0.002
TRACED_CHANGE_BYTES = 40 << 20
STACK_DEPTH = 6
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


def stack_of(thread_id: int) -> str:
    frame, names = sys._current_frames().get(thread_id), []
    while frame is not None and len(names) < STACK_DEPTH:
        names.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}:{frame.f_code.co_name}")
        frame = frame.f_back
    return " <- ".join(names)


class PhaseSampler:
    """The peak resident set per (step, phase), and the optimizer steps' changes with the stack that made them."""

    def __init__(self, training_thread: int):
        self.where = (0, "init")  # (step, phase), replaced whole: the sampler never sees one without the other
        self.peaks, self.changes = {}, []
        self._training_thread, self._last_traced = training_thread, 0

    def sample_forever(self):
        while True:
            (step, phase), now = self.where, resident_bytes()
            key = f"{step}:{phase}"
            if now > self.peaks.get(key, 0):
                self.peaks[key] = now
            if phase == "step" and abs(now - self._last_traced) > TRACED_CHANGE_BYTES:
                self.changes.append([step, now, stack_of(self._training_thread)])
                self._last_traced = now
            time.sleep(SAMPLE_S)

    def marking(self, name, method):
        """``method`` with its phase marked: ``name`` while it runs, "after_<name>" once it returned."""
        def marked(engine, *args, **kwargs):
            step = self.where[0]
            self.where = (step, name)
            try:
                return method(engine, *args, **kwargs)
            finally:
                self.where = (step + 1 if name == "step" else step, "after_" + name)
        return marked


def main() -> int:
    out = os.environ.get("STEP_RSS_OUT", "step-rss.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)  # before training: not a late error
    sys.path.insert(0, HERE)
    import train  # its module code first: it answers py-cpuinfo before deepspeed is imported
    from deepspeed.runtime.engine import DeepSpeedEngine
    sampler = PhaseSampler(threading.get_ident())
    threading.Thread(target=sampler.sample_forever, daemon=True, name="step-rss").start()
    for name in ("forward", "backward", "step"):
        setattr(DeepSpeedEngine, name, sampler.marking(name, getattr(DeepSpeedEngine, name)))
    try:
        return train.main(sys.argv[1:])
    finally:
        peaks, changes = dict(sampler.peaks), list(sampler.changes)
        with open(out, "w") as handle:
            json.dump({"argv": sys.argv[1:], "peaks": peaks, "changes": changes}, handle, indent=1)
        for key, nbytes in peaks.items():
            print(f"[sample_step_rss] peak {key:18s} {nbytes / GIB:.3f} GiB", flush=True)
        for step, nbytes, stack in changes:
            print(f"[sample_step_rss] step {step} {nbytes / GIB:.3f} GiB {stack}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
