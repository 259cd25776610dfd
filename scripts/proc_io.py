"""This process's storage I/O as the kernel counts it (/proc/self/io): what scripts/train.py records for each step
of every arm alike (stock DeepSpeed counts nothing itself), and what tests/deepspeed/measure_checkpoint_save.py
measures a save by. Standard library only, loaded beside the scripts that use it."""


def read_proc_io(path="/proc/self/io"):
    """read_bytes/write_bytes of this process (all threads, storage layer, O_DIRECT included); None where the kernel
    does not give them (a kernel without task I/O accounting, a container that hides the file): a step then records
    no I/O bytes rather than 0, which the bench would report as a step that wrote nothing (no drive wear)."""
    out = {}
    try:
        with open(path) as fh:
            for line in fh:
                key, _, value = line.partition(":")
                out[key.strip()] = int(value)
    except (OSError, ValueError):
        return None
    if "read_bytes" not in out or "write_bytes" not in out:
        return None
    return {"read_bytes": out["read_bytes"], "write_bytes": out["write_bytes"]}


def io_delta(before, after, key):
    """``after[key] - before[key]``, None where either reading is missing (read_proc_io)."""
    return None if before is None or after is None else after[key] - before[key]
