"""Host memory of a training run, phase by phase: runs scripts/train.py's main in this process (its arguments,
unchanged) and records, after deepspeed.initialize and after each engine.step, the resident set (VmRSS), its
high-water mark since the previous record (VmHWM, reset through /proc/self/clear_refs) and glibc's heap (mallinfo2:
its arena, the free memory in it, the bytes in mapped chunks). What the step model's host terms are checked against
(plan/step_model/costs.py ``heap_kept_bytes``; docs/estimate.md, "Host memory beside the tensors").

    python scripts/measure_host_rest.py --deepspeed_config CONFIG --model gpt2-small --dtype fp32 --seq-len 32 \\
        --micro-batch 1 --steps 5 --weights-gather none --untouched-stock     # one rank
    deepspeed --num_gpus 2 scripts/measure_host_rest.py ...                    # two: one file per rank

Writes ``$HOST_REST_OUT.rank<R>.json`` (default ``host-rest``). The reset also lowers the process's ru_maxrss, so
the ``peak_rss_bytes`` of train.py's own result counts from the last record only. Linux, glibc 2.33 or later
(mallinfo2).
"""
import ctypes
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _MallInfo2


# Read here, not through tencache_ds (memory/footprint.py reads the same file): importing the package installs the
# plugin, and the stock runs measured with --untouched-stock must run in a process that never imported it.
def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def record() -> dict:
    """This moment's figures, and the high-water mark since the last record; then reset the mark."""
    heap = _LIBC.mallinfo2()
    out = {"rss": _status_bytes("VmRSS"), "hwm": _status_bytes("VmHWM"), "heap_arena": heap.arena,
           "heap_free": heap.fordblks, "mapped_chunks": heap.hblkhd}
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current VmRSS
    return out


def main() -> int:
    out = os.environ.get("HOST_REST_OUT", "host-rest")
    path = f"{out}.rank{os.environ.get('RANK', '0')}.json"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # before training: not a late error
    records = {"argv": sys.argv[1:], "after_initialize": None, "after_steps": []}
    sys.path.insert(0, HERE)
    import train  # its module code first: it answers py-cpuinfo before deepspeed is imported
    from deepspeed.runtime.engine import DeepSpeedEngine
    initialize, step = train.deepspeed.initialize, DeepSpeedEngine.step

    def initialize_recorded(*args, **kwargs):
        result = initialize(*args, **kwargs)
        records["after_initialize"] = record()
        return result

    def step_recorded(self, *args, **kwargs):
        result = step(self, *args, **kwargs)
        records["after_steps"].append(record())
        return result

    train.deepspeed.initialize, DeepSpeedEngine.step = initialize_recorded, step_recorded
    try:
        return train.main(sys.argv[1:])
    finally:
        with open(path, "w") as handle:
            json.dump(records, handle, indent=1)
        steps = records["after_steps"]
        if steps:
            peak = max(s["hwm"] for s in [records["after_initialize"]] + steps)  # the process's, as ru_maxrss
            print(f"[measure_host_rest] {path}: after initialize {records['after_initialize']['rss'] / GIB:.2f} GiB,"
                  f" between steps {steps[-1]['rss'] / GIB:.2f} GiB, peak {peak / GIB:.2f} GiB", flush=True)


if __name__ == "__main__":
    sys.exit(main())
