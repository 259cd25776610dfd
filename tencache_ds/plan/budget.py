"""Byte budgets per tier. Owns: turning "auto" into numbers from machine facts, and fitting a host budget to the
node's memory (shared by the node's ranks) and to the process's memlock limit (after the streaming slots). Does
not own: probing devices beyond what the standard library and psutil can see (the accelerator's free memory is
passed in).

Host memory is a node's: "auto" and the "fits the machine" checks divide it between the ranks of the node
(probes/limits.py: ``LOCAL_SIZE`` from the deepspeed launcher, ``LOCAL_WORLD_SIZE`` from torchrun). In a container
it is the container's: the node's memory bounded by the memory cgroup's limit (probes/host_memory.py).
RLIMIT_MEMLOCK is a process's: each rank may lock up to the whole limit, so it is never divided.

Pure but for MachineResources.probe, which gathers the machine's readings from probes/ (the leaf that reads /proc,
cgroups and rlimits). Imports neither torch nor deepspeed (nor psutil), so it is testable anywhere and usable by
`tencache-ds doctor`.
"""
import dataclasses
from typing import Tuple

from ..config import AUTO, TencacheConfig
from ..log import logger
from ..probes.host_memory import read_host_memory
# UNLIMITED and lockable_bytes_now are also the planner's vocabulary for its callers (config_checks, the stores)
from ..probes.limits import (UNLIMITED, local_world_size, lockable_bytes_now, memlock_limit_bytes,  # noqa: F401
                             ranks_on_node_known)
from ..units import fmt_bytes

# "auto" takes this share of the host memory that is available when the run starts. The rest stays for the
# model's activations, DeepSpeed's own CPU buffers and the page cache that NVMe reads go through.
AUTO_HOST_CACHE_FRACTION = 0.25
# and this share of the accelerator memory that is free once the engine is built.
AUTO_DEVICE_CACHE_FRACTION = 0.5



DESCRIBED = "described:"  # MachineResources.host_bound_by of a machine file's host


@dataclasses.dataclass(frozen=True)
class MachineResources:
    """What the planner needs to know about the machine, in bytes. Host memory is the node's, or its memory
    cgroup's when that is smaller (all its ranks share it); ``memlock_limit_bytes`` is this process's, UNLIMITED
    (-1) when there is no limit; ``device_free_bytes`` is 0 without an accelerator; ``local_world_size``: ranks on
    this node, ``local_world_size_guessed`` where no launcher said and they were not counted yet (probes/limits.py:
    every rank of the job taken for this node's, which divides shares safely but must not multiply a demand)."""

    host_total_bytes: int
    host_available_bytes: int
    memlock_limit_bytes: int
    device_free_bytes: int = 0
    local_world_size: int = 1
    local_world_size_guessed: bool = False
    # "node", or the memory cgroup folder whose limit bounds the host memory, or DESCRIBED + a machine file's name
    # (an estimate's machine, not this one): for messages
    host_bound_by: str = "node"

    @classmethod
    def probe(cls, device_free_bytes: int = 0) -> "MachineResources":
        memory = read_host_memory()
        return cls(host_total_bytes=memory.total_bytes, host_available_bytes=memory.available_bytes,
                   memlock_limit_bytes=memlock_limit_bytes(), device_free_bytes=device_free_bytes,
                   local_world_size=local_world_size(), local_world_size_guessed=not ranks_on_node_known(),
                   host_bound_by=memory.bound_by)

    @property
    def host_memory_name(self) -> str:
        """How messages name the host memory: the machine's, or its container's."""
        if self.host_bound_by.startswith(DESCRIBED):
            return f"the physical memory of the described machine {self.host_bound_by[len(DESCRIBED):]}"
        return "this machine's physical memory" if self.host_bound_by == "node" else \
            f"the memory limit of this process's cgroup ({self.host_bound_by})"

    @property
    def host_available_per_rank_bytes(self) -> int:
        """This rank's share of the node's available memory."""
        return self.host_available_bytes // max(1, self.local_world_size)


@dataclasses.dataclass(frozen=True)
class ResolvedBudgets:
    """The two cache budgets with "auto" resolved; ``*_source`` says "auto" or "config". ``adjustments``: why the
    host budget is below what was asked (empty when it is not), one sentence each with the numbers."""

    host_cache_bytes: int
    device_cache_bytes: int
    host_source: str
    device_source: str
    adjustments: Tuple[str, ...] = ()


def parameter_lock_mode(pin_memory: str, accelerator_is_host: bool) -> str:
    """How the parameter store's slots are page-locked (memory/arena.py's lock modes), from the block's
    ``pin_memory`` and the accelerator. Locking is for the accelerator's copies: a GPU copies asynchronously only
    from page-locked memory. On a host accelerator (DeepSpeed's CPU accelerator) nothing copies from the slots
    (a gather reads them in host memory, O_DIRECT pins pages for the length of a request itself), so "best_effort"
    locks nothing there: locked memory would only count against the memlock limit and be memory the kernel cannot
    reclaim. "required" is the user's word and is kept."""
    if pin_memory == "best_effort" and accelerator_is_host:
        return "off"
    return pin_memory


def resolve_budgets(config: TencacheConfig, machine: MachineResources, *,
                    stream_min_bytes: int, locks_memory: bool) -> ResolvedBudgets:
    """Resolve "auto" budgets and fit the host budget to this rank's share of the node and to its memlock limit.

    ``stream_min_bytes``: what this process page-locks for streaming whatever the cache (the parameter swapper's
    streaming slots; 0 when none are planned yet). Every caller passes it, so that the host cache never pushes
    locked memory past the memlock limit. ``locks_memory``: False when the parameter slots are not page-locked
    (``parameter_lock_mode`` "off"): the memlock limit then bounds nothing.

    "auto" is ``AUTO_HOST_CACHE_FRACTION`` of the node's available memory divided by the ranks on the node, at
    most the memlock limit minus ``stream_min_bytes`` (per process: not divided). An explicit budget above this
    rank's share of the available memory is lowered to that share, and the reason logged. An explicit budget is
    not cut to the memlock limit here: only its parameter part is locked, and the parameter store fits that to
    the limit when it plans its slots (``cache_lock_room``). With "pin_memory": "required",
    config_checks.check_host_budget rejects a budget that does not fit before anything is written.
    """
    adjustments = []
    ranks = max(1, machine.local_world_size)
    per_rank = machine.host_available_per_rank_bytes
    if config.host_cache_bytes == AUTO:
        host, host_source = int(per_rank * AUTO_HOST_CACHE_FRACTION), AUTO
    else:
        host, host_source = int(config.host_cache_bytes), "config"
        if host > per_rank:
            adjustments.append(
                f"host_cache_bytes {fmt_bytes(host)} is more than this rank's share of the available memory "
                f"({fmt_bytes(machine.host_available_bytes)} available / {ranks} rank(s) on this node = "
                f"{fmt_bytes(per_rank)}): lowered to {fmt_bytes(per_rank)}")
            host = per_rank
    if host_source == AUTO and locks_memory and machine.memlock_limit_bytes != UNLIMITED:
        host = min(host, max(0, machine.memlock_limit_bytes - max(0, int(stream_min_bytes))))
    if config.device_cache_bytes == AUTO:
        device, device_source = int(machine.device_free_bytes * AUTO_DEVICE_CACHE_FRACTION), AUTO
    else:
        device, device_source = int(config.device_cache_bytes), "config"
    budgets = ResolvedBudgets(host, device, host_source, device_source, tuple(adjustments))
    for reason in adjustments:
        _log_once(reason)
    return budgets


def cache_lock_room(lockable_bytes: int, streaming_bytes: int) -> int:
    """Bytes of cache slots a store may lock on top of ``streaming_bytes`` of streaming slots it is about to lock,
    when the process may lock ``lockable_bytes`` more (UNLIMITED: no limit). E.g. 1 GiB lockable, 256 MiB of
    streaming slots: 768 MiB of cache slots; 100 MiB lockable: none (and the streaming slots are short)."""
    if lockable_bytes == UNLIMITED:
        return UNLIMITED
    return max(0, int(lockable_bytes) - max(0, int(streaming_bytes)))


_logged = set()


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        logger.warning("host budget adapted to this machine: %s", message)
