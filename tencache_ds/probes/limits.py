"""This process's limits and place on the node. Owns: reading RLIMIT_MEMLOCK and CAP_IPC_LOCK (how much it may
page-lock), VmLck (how much it has locked), and how many ranks share the node (the launcher's variable). Does not own:
what to do with the numbers (plan/budget.py, memory/arena.py).

Leaf module: imports nothing from tencache_ds, nor torch or deepspeed.
"""
import os
import resource
from typing import Optional

UNLIMITED = -1
# Ranks on this node, as each launcher says it: torchrun's, the deepspeed launcher's (launcher/launch.py sets
# LOCAL_SIZE, never LOCAL_WORLD_SIZE: until 2026-12-07 every rank it started counted itself alone on its node, and
# split nothing between the ranks: helper-148's review), Open MPI's (DeepSpeed's mpirun runners)
LOCAL_WORLD_SIZE_ENVS = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def local_world_size() -> int:
    """Ranks on this node: the first of ``LOCAL_WORLD_SIZE_ENVS`` a launcher set (to a whole number), else 1."""
    for name in LOCAL_WORLD_SIZE_ENVS:
        try:
            return max(1, int(os.environ[name]))
        except (KeyError, ValueError):
            continue
    return 1


def locked_bytes_now() -> Optional[int]:
    """Bytes this process has page-locked now (``VmLck`` in /proc/self/status), which count against its memlock
    limit; None where it cannot be read."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmLck:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def lockable_bytes_now() -> int:
    """How many more bytes this process may page-lock: UNLIMITED, or its memlock limit minus what it has locked."""
    limit = memlock_limit_bytes()
    return UNLIMITED if limit == UNLIMITED else max(0, limit - (locked_bytes_now() or 0))


CAP_IPC_LOCK = 14  # linux/capability.h: a process with it may lock memory past RLIMIT_MEMLOCK


def memlock_limit_bytes() -> int:
    """How much this process may page-lock: UNLIMITED when RLIMIT_MEMLOCK is infinite or the process holds
    CAP_IPC_LOCK (root in most containers, where `ulimit -l` shows a limit that does not apply), else the soft
    limit."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or has_ipc_lock_capability():
        return UNLIMITED
    return int(soft)


def has_ipc_lock_capability() -> bool:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except OSError:
        pass
    return False
