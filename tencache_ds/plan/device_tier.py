"""Which gathered parameters stay on the device between uses. Owns: the device tier's admission and eviction
(Belady over the profiled use sequence, under a byte budget) and how its budget is resolved. Pure: keys, sizes
and positions; integrations/deepspeed/coordinator.py turns the decisions into DeepSpeed calls.

ZeRO-3 releases (re-partitions) a parameter after each use unless it is used again within
``stage3_max_reuse_distance``. 10Cache keeps it instead while the device budget allows, choosing by next use: the
last layers of the forward pass are the first of the backward, and with the whole step in the profile the choice
spans the optimizer step too. A kept parameter is resident at its next fetch: a hit, with no swap-in, no copy and
no release/re-lend bookkeeping.
"""
import math
from typing import Callable, Dict, Hashable, List, Optional, Tuple

from ..profile.next_use import NextUseIndex


def device_tier_budget(configured, device_is_host: bool, host_param_cache_bytes: int,
                       device_free_bytes: int, auto_fraction: float) -> int:
    """Bytes the device tier may keep gathered.

    On an accelerator: ``configured`` bytes, or ``auto_fraction`` of its free memory for "auto". When the device is
    host memory (DeepSpeed's CPU accelerator), a kept parameter's bytes are the host tier's own buffer (the gather
    is a view of the lent partition), so the tier is carved out of the parameters' share of the host cache, never
    added to it: "auto" is that share, a configured size is capped by it."""
    if device_is_host:
        share = max(0, int(host_param_cache_bytes))
        return share if configured == "auto" else min(max(0, int(configured)), share)
    if configured == "auto":
        return int(max(0, device_free_bytes) * auto_fraction)
    return max(0, int(configured))


class DeviceTier:
    """The set of parameters kept gathered past their release, within ``budget_bytes``.

    ``index`` knows each key's next use (positions in the step's use sequence, cyclic across steps); without one
    (no complete trace yet, or the live sequence diverged from it) nothing is kept: demand fetching.

    Invariant (``check``): ``resident_bytes`` is the sum of the residents' sizes and never exceeds the budget, except
    after a ``resize`` while a resident that must go is in use (it goes at its release).
    """

    def __init__(self, budget_bytes: int):
        self.budget_bytes = max(0, int(budget_bytes))
        self.index: Optional[NextUseIndex] = None
        self._resident: Dict[Hashable, int] = {}  # key -> bytes, in admission order
        self.resident_bytes = 0
        self.admitted = 0  # COUNTERS over the tier's life
        self.evicted = 0

    def set_index(self, index: Optional[NextUseIndex]) -> List[Hashable]:
        """Use ``index`` from now on; with None, keep nothing. Returns the keys to release now (all residents when
        the index goes away: without a prediction there is no reason to hold them)."""
        self.index = index
        return self.drain() if index is None else []

    def __contains__(self, key) -> bool:
        return key in self._resident

    def resident_keys(self) -> List[Hashable]:
        return list(self._resident)

    def on_release(self, key: Hashable, nbytes: int, position: int,
                   evictable: Callable[[Hashable], bool]) -> Tuple[bool, List[Hashable]]:
        """DeepSpeed is about to release ``key`` (``nbytes`` gathered) at ``position``. Returns (keep, victims):
        keep it gathered, and release the ``victims`` instead (residents used later than ``key``, farthest first,
        each ``evictable``); or (False, []) to let the release happen."""
        if self.index is None or nbytes > self.budget_bytes:
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
            later = sorted((k for k in self._resident if evictable(k)),
                           key=lambda k: -self.index.distance(k, position))
            for candidate in later:
                if needed <= 0 or self.index.distance(candidate, position) <= own_distance:
                    break
                victims.append(candidate)
                needed -= self._resident[candidate]
            if needed > 0:
                return False, []  # not worth it: everything that could make room is needed sooner
        for victim in victims:
            self._forget(victim)
            self.evicted += 1
        self._resident[key] = nbytes
        self.resident_bytes += nbytes
        self.admitted += 1
        return True, victims

    def resize(self, budget_bytes: int, position: int, evictable: Callable[[Hashable], bool]) -> List[Hashable]:
        """A new budget (the host tier it is carved from shrank or grew). Returns the residents to release so that
        the rest fits: those used farthest from ``position`` first, each ``evictable`` (one that is not stays, over
        the budget, until it is released)."""
        self.budget_bytes = max(0, int(budget_bytes))
        excess = self.resident_bytes - self.budget_bytes
        if excess <= 0:
            return []
        order = [key for key in self._resident if evictable(key)]
        if self.index is not None:
            order.sort(key=lambda key: -self.index.distance(key, position))
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

    def check(self) -> None:
        assert self.resident_bytes == sum(self._resident.values()), (self.resident_bytes, self._resident)
        assert self.resident_bytes <= self.budget_bytes, (self.resident_bytes, self.budget_bytes)

    def _forget(self, key) -> None:
        nbytes = self._resident.pop(key, None)
        if nbytes is not None:
            self.resident_bytes -= nbytes
