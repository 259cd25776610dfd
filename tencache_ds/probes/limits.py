"""This process's limits and place on the node. Owns: reading RLIMIT_MEMLOCK and CAP_IPC_LOCK (how much it may
page-lock), VmLck (how much it has locked), and how many ranks share the node (the launcher's variable, or as counted). Does not own:
what to do with the numbers (plan/budget.py, memory/arena.py).

Leaf module: imports nothing from tencache_ds, nor torch or deepspeed.
"""
import os
import re
import resource
from typing import Optional

UNLIMITED = -1
# Ranks on this node, as each launcher says it: torchrun's, the deepspeed launcher's (launcher/launch.py sets
# LOCAL_SIZE, never LOCAL_WORLD_SIZE: until 2026-12-07 every rank it started counted itself alone on its node, and
# split nothing between the ranks: helper-148's review), Open MPI's (DeepSpeed's openmpi runner), MVAPICH's and
# MPICH's or Intel MPI's (its mvapich and mpich/impi runners; helper-156's review); Slurm's srun below
LOCAL_WORLD_SIZE_ENVS = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE",
                         "MPI_LOCALNRANKS")


# Ranks on this node as counted among the job's ranks (integrations/deepspeed/node_ranks.py), where no launcher
# variable says: None until counted
_counted_ranks_on_node: Optional[int] = None


def local_world_size() -> int:
    """Ranks on this node: the first of ``LOCAL_WORLD_SIZE_ENVS`` a launcher set (to a whole number), else what
    srun says of this node (``_slurm_step_tasks_on_this_node``), else the ranks counted on this node among the job's
    (``note_ranks_on_node``), else every rank of ``WORLD_SIZE``: a launch that says nothing of the node (Lightning's
    subprocess launcher, an mp.spawn script set LOCAL_RANK and WORLD_SIZE only) is taken for one node until its ranks
    are counted, where each rank counting itself alone took the whole node's share per rank (eight ranks, twice the
    node's memory: helper-178); on several nodes that guess leaves each rank less than its share, and is used for
    nothing else (``ranks_on_node_known``). Else 1."""
    told = told_ranks_on_node()
    if told is not None:
        return told
    try:
        return max(1, int(os.environ["WORLD_SIZE"]))
    except (KeyError, ValueError):
        return 1


def ranks_on_node_known() -> bool:
    """Whether ``local_world_size`` is what a launcher said or what was counted, not the guess from WORLD_SIZE (which
    on several nodes is every node's ranks: a reserve or a refusal multiplied by it stopped runs that fit, where a
    share divided by it only leaves less: helper-184). True without WORLD_SIZE (one process)."""
    return told_ranks_on_node() is not None or "WORLD_SIZE" not in os.environ


def ranks_on_node_told() -> bool:
    """Whether a launcher variable said, or the ranks were counted (``note_ranks_on_node``)."""
    return told_ranks_on_node() is not None


def note_ranks_on_node(count: int) -> None:
    """The ranks found on this node by counting them (where no launcher variable says): ``local_world_size`` from
    now on."""
    global _counted_ranks_on_node
    _counted_ranks_on_node = max(1, int(count))


def told_ranks_on_node() -> Optional[int]:
    """The ranks on this node as a launcher said (``LOCAL_WORLD_SIZE_ENVS``, srun's step) or as counted; None."""
    for name in LOCAL_WORLD_SIZE_ENVS:
        try:
            return max(1, int(os.environ[name]))
        except (KeyError, ValueError):
            continue
    slurm = _slurm_step_tasks_on_this_node()
    if slurm:
        return max(1, slurm)
    return _counted_ranks_on_node


def _slurm_step_tasks_on_this_node() -> Optional[int]:
    """The tasks srun started on this node (DeepSpeed's slurm runner, a bare srun): ``SLURM_STEP_TASKS_PER_NODE``
    lists them per node of the step ("2(x3),1": 2 on each of the first three nodes, then 1), ``SLURM_NODEID`` is
    this node's place. Not the allocation's ``SLURM_TASKS_PER_NODE``, which a batch script's own single process
    sees too. None where either is missing or not understood."""
    spec, node = os.environ.get("SLURM_STEP_TASKS_PER_NODE"), os.environ.get("SLURM_NODEID")
    if spec is None or node is None:
        return None
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    try:
        index = int(node)
    except ValueError:
        return None
    return counts[index] if 0 <= index < len(counts) else None


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
    """CAP_IPC_LOCK that the kernel's mlock check honours: held in the initial user namespace. Root of a user
    namespace (rootless Podman, an unprivileged LXD container, ``unshare -r``) shows it in CapEff, but the kernel
    checks it against the initial namespace and applies RLIMIT_MEMLOCK: taken as unlimited, a "required" pin passed
    the start-up check and failed in zero.Init, after partitions were written (helper-197)."""
    try:
        with open("/proc/self/status") as status:
            held = any(line.startswith("CapEff:") and int(line.split()[1], 16) >> CAP_IPC_LOCK & 1
                       for line in status)
    except (OSError, ValueError, IndexError):
        return False
    return held and in_initial_user_namespace()


def in_initial_user_namespace(uid_map: Optional[str] = None) -> bool:
    """Is this process in the initial user namespace (``/proc/self/uid_map``, or its text ``uid_map``, maps every
    uid onto itself)? True where the file cannot be read (a kernel without user namespaces)."""
    if uid_map is None:
        try:
            with open("/proc/self/uid_map") as mapping:
                uid_map = mapping.read()
        except OSError:
            return True
    return [line.split() for line in uid_map.splitlines() if line.strip()] == [["0", "0", "4294967295"]]
