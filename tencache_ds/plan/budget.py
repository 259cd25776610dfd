"""Byte budgets per tier. Owns: turning "auto" into numbers from machine facts. Does not own: probing devices
beyond what the standard library and psutil can see (the accelerator's free memory is passed in).

Imports neither torch nor deepspeed, so it is testable anywhere and usable by `tencache-ds doctor`.
"""
import dataclasses
import resource
from typing import Optional

from ..config import AUTO, TencacheConfig

# "auto" takes this share of the host memory that is available when the run starts. The rest stays for the
# model's activations, DeepSpeed's own CPU buffers and the page cache that NVMe reads go through.
AUTO_HOST_CACHE_FRACTION = 0.25
# and this share of the accelerator memory that is free once the engine is built.
AUTO_DEVICE_CACHE_FRACTION = 0.5

UNLIMITED = -1


@dataclasses.dataclass(frozen=True)
class MachineResources:
    """What the planner needs to know about the machine, in bytes. ``memlock_limit_bytes`` is UNLIMITED (-1) when
    there is no limit; ``device_free_bytes`` is 0 without an accelerator."""

    host_total_bytes: int
    host_available_bytes: int
    memlock_limit_bytes: int
    device_free_bytes: int = 0

    @classmethod
    def probe(cls, device_free_bytes: int = 0) -> "MachineResources":
        import psutil
        memory = psutil.virtual_memory()
        return cls(host_total_bytes=memory.total, host_available_bytes=memory.available,
                   memlock_limit_bytes=memlock_limit_bytes(), device_free_bytes=device_free_bytes)


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


@dataclasses.dataclass(frozen=True)
class ResolvedBudgets:
    """The two cache budgets with "auto" resolved; ``*_source`` says "auto" or "config"."""

    host_cache_bytes: int
    device_cache_bytes: int
    host_source: str
    device_source: str


def resolve_budgets(config: TencacheConfig, machine: MachineResources,
                    stream_min_bytes: Optional[int] = None) -> ResolvedBudgets:
    """Resolve "auto" budgets. ``stream_min_bytes`` is what the streaming pools already lock, so that an automatic
    host cache never pushes locked memory past the memlock limit."""
    if config.host_cache_bytes == AUTO:
        host = int(machine.host_available_bytes * AUTO_HOST_CACHE_FRACTION)
        if machine.memlock_limit_bytes != UNLIMITED:
            host = max(0, min(host, machine.memlock_limit_bytes - (stream_min_bytes or 0)))
        host_source = AUTO
    else:
        host, host_source = int(config.host_cache_bytes), "config"
    if config.device_cache_bytes == AUTO:
        device, device_source = int(machine.device_free_bytes * AUTO_DEVICE_CACHE_FRACTION), AUTO
    else:
        device, device_source = int(config.device_cache_bytes), "config"
    return ResolvedBudgets(host, device, host_source, device_source)
