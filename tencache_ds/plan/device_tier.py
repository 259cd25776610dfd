"""Which gathered parameters stay on the device between uses. Owns: the device tier's admission and eviction
(Belady over the profiled use sequence, under a byte budget: the rules of plan/eviction.py) and how its budget is
resolved. Pure: keys, sizes and positions; integrations/deepspeed/coordinator.py turns the decisions into DeepSpeed
calls.

ZeRO-3 releases (re-partitions) a parameter after each use unless it is used again within
``stage3_max_reuse_distance``. 10Cache keeps it instead while the device budget allows, choosing by next use: the
last layers of the forward pass are the first of the backward, and with the whole step in the profile the choice
spans the optimizer step too. A kept parameter is resident at its next fetch: a hit, with no swap-in, no copy and
no release/re-lend bookkeeping.
"""
import math
from typing import Callable, Dict, Hashable, List, Optional, Tuple

from ..profile.next_use import NextUseIndex
from .eviction import farthest_first, victims_for


def device_tier_budget(configured, gathers_alias_partitions: bool, host_param_cache_bytes: int,
                       device_free_bytes: int, auto_fraction: float, resident_bytes: int = 0,
                       step_peak_rise_bytes: int = 0) -> int:
    """Bytes the device tier may keep gathered, from this rank's readings (ranks then agree on the smallest:
    integrations/deepspeed/agreement.py).

    Where a gathered parameter is a view of its host partition (DeepSpeed's CPU accelerator at one rank), a kept
    parameter's bytes are the host tier's own buffer: the tier is carved out of the parameters' share of the host
    cache, never added to it; "auto" is that share, a configured size is capped by it.

    Elsewhere a gathered parameter is memory of its own (GPU memory; host memory for the all-gather's output on the
    CPU accelerator at several ranks). ``device_free_bytes`` is what that memory has free now, ``resident_bytes``
    what the tier holds now (its own, so available to it), ``step_peak_rise_bytes`` how far a step rose above the
    level between steps (activations): "auto" is ``auto_fraction`` of free plus resident, never more than what leaves
    a step's rise free; a configured size is taken as it is."""
    if gathers_alias_partitions:
        share = max(0, int(host_param_cache_bytes))
        return share if configured == "auto" else min(max(0, int(configured)), share)
    if configured != "auto":
        return max(0, int(configured))
    room = max(0, int(device_free_bytes)) + max(0, int(resident_bytes))
    return max(0, min(int(room * auto_fraction), room - max(0, int(step_peak_rise_bytes))))


class DeviceTier:
    """The set of parameters kept gathered past their release, within ``budget_bytes``.

    ``index`` knows each key's next use (positions in the step's use sequence, cyclic across steps); without one
    (the live sequence diverged from the trace: an eval pass, a changed module order) nothing is evicted, as there
    is no telling what is needed next: residents stay, and a newcomer is kept while it fits. They are current until
    the optimizer step or a forced release (the caller's to release), and what comes next (the eval pass, the step
    traced again) uses the same parameters.

    Invariant (``check``): ``resident_bytes`` is the sum of the residents' sizes and never exceeds the budget, except
    after a ``resize`` while a resident that must go is in use (it goes at its release); ``peak_resident_bytes`` is
    never below it.
    """

    def __init__(self, budget_bytes: int):
        self.budget_bytes = max(0, int(budget_bytes))
        self.index: Optional[NextUseIndex] = None
        self._resident: Dict[Hashable, int] = {}  # key -> bytes, in admission order
        self.resident_bytes = 0
        # the most it held since restart_peak(): at the end of an optimizer step the tier is empty again (the
        # update made every kept copy stale), so what it held during the step is only seen here
        self.peak_resident_bytes = 0
        self.admitted = 0  # COUNTERS over the tier's life
        self.evicted = 0

    def set_index(self, index: Optional[NextUseIndex]) -> None:
        """Use ``index`` from now on (None: admit nothing new). Residents stay; one the new index does not know is
        used never again as far as it can tell, so it is the first to make room."""
        self.index = index

    def __contains__(self, key) -> bool:
        return key in self._resident

    def resident_keys(self) -> List[Hashable]:
        return list(self._resident)

    def on_release(self, key: Hashable, nbytes: int, position: int,
                   evictable: Callable[[Hashable], bool]) -> Tuple[bool, List[Hashable]]:
        """DeepSpeed is about to release ``key`` (``nbytes`` gathered) at ``position``. Returns (keep, victims):
        keep it gathered, and release the ``victims`` instead (residents used later than ``key``, farthest first,
        each ``evictable``); or (False, []) to let the release happen."""
        if self.index is None:  # no prediction: a resident stays, a newcomer only into free room (see the class)
            if key not in self._resident and self.resident_bytes + nbytes <= self.budget_bytes:
                self._admit(key, nbytes)
            return key in self._resident, []
        if nbytes > self.budget_bytes:
            self._forget(key)
            return False, []
        if key in self._resident:
            self._forget(key)  # re-admitted below under the same rule as a newcomer
        own_distance = self.index.distance(key, position)
        if math.isinf(own_distance):
            return False, []
        needed = self.resident_bytes + nbytes - self.budget_bytes
        victims: List[Hashable] = []
        if needed > 0:
            farthest = farthest_first([k for k in self._resident if evictable(k)], self.index, position)
            victims = victims_for(needed, farthest, self._resident.__getitem__, self.index, position, own_distance)
            if victims is None:
                return False, []  # not worth it: everything that could make room is needed sooner
        for victim in victims:
            self._forget(victim)
            self.evicted += 1
        self._admit(key, nbytes)
        return True, victims

    def resize(self, budget_bytes: int, position: int, evictable: Callable[[Hashable], bool]) -> List[Hashable]:
        """A new budget (the host tier it is carved from shrank or grew). Returns the residents to release so that
        the rest fits: those used farthest from ``position`` first, each ``evictable`` (one that is not stays, over
        the budget, until it is released)."""
        self.budget_bytes = max(0, int(budget_bytes))
        excess = self.resident_bytes - self.budget_bytes
        if excess <= 0:
            return []
        order = farthest_first([key for key in self._resident if evictable(key)], self.index, position)
        victims = []
        for key in order:
            if excess <= 0:
                break
            excess -= self._resident[key]
            victims.append(key)
        for key in victims:
            self._forget(key)
            self.evicted += 1
        return victims

    def forget(self, key: Hashable) -> None:
        """``key`` was released or re-partitioned by someone else: no longer ours to account."""
        self._forget(key)

    def drain(self) -> List[Hashable]:
        """Every resident, to release; the tier is empty afterwards."""
        keys = list(self._resident)
        self._resident.clear()
        self.resident_bytes = 0
        return keys

    def restart_peak(self) -> None:
        """A new period (an optimizer step) begins: its peak starts from what is resident now."""
        self.peak_resident_bytes = self.resident_bytes

    def check(self) -> None:
        assert self.resident_bytes == sum(self._resident.values()), (self.resident_bytes, self._resident)
        assert self.resident_bytes <= self.budget_bytes, (self.resident_bytes, self.budget_bytes)
        assert self.resident_bytes <= self.peak_resident_bytes, (self.resident_bytes, self.peak_resident_bytes)

    def _admit(self, key, nbytes: int) -> None:
        self._resident[key] = nbytes
        self.resident_bytes += nbytes
        self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)
        self.admitted += 1

    def _forget(self, key) -> None:
        nbytes = self._resident.pop(key, None)
        if nbytes is not None:
            self.resident_bytes -= nbytes
