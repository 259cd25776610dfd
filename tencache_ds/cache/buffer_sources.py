"""Where a store's host buffers come from. Owns: the ``BufferSource`` protocol a store allocates through, and its
two implementations: pinned arena slots for parameter partitions (``ArenaSlots``), budgeted pageable memory for
optimizer state (``BudgetedPageable``). Does not own: which entry holds a buffer or gives it up (the store,
cache/entry_store.py), the arena's slots and classes (memory/pool.py), how large a budget is (plan/host_tier.py).
"""
from typing import Dict, Optional, Protocol

from ..memory.pool import BufferPool, HostBuffer
from ..units import HOST_PAGE_BYTES, round_up
from .host_budget import HostBudget


class BufferSource(Protocol):
    """What a store asks of the memory its buffers come from."""

    bypass: bool  # True: an entry needed later than every candidate victim is served transiently, not admitted
    holds_prefixes: bool  # True: room no whole tensor fits in may hold the first bytes of one (cache/entry.py)

    def spare_bytes(self) -> int:
        """Bytes a prefix could take now without evicting anything (0 where prefixes are not held)."""

    def try_acquire(self, nbytes: int) -> Optional[HostBuffer]:
        """A buffer of at least ``nbytes`` that may be kept between uses, or None when none is free now."""

    def fallback(self, nbytes: int) -> HostBuffer:
        """A transient buffer (given back after use) when no keepable one is free and none can be freed."""

    def try_acquire_idle(self, nbytes: int) -> Optional[HostBuffer]:
        """A transient buffer from memory the source holds and nothing uses now (no new mapping, no wait), or
        None."""

    def keeps(self, buffer: HostBuffer) -> bool:
        """May ``buffer`` stay in host memory between uses (a cached copy)?"""

    def frees_room_for(self, buffer: HostBuffer, nbytes: int) -> bool:
        """Would giving ``buffer`` back let ``try_acquire(nbytes)`` succeed (an eviction worth making)?"""

    def room_needed(self, nbytes: int) -> int:
        """How many bytes of fitting buffers must be given back before ``try_acquire(nbytes)`` can succeed."""

    def transient_available(self, nbytes: int) -> bool:
        """Can ``fallback(nbytes)`` serve from memory the source already has (no new mapping)?"""

    def frees_transient_room_for(self, buffer: HostBuffer, nbytes: int) -> bool:
        """Would giving ``buffer`` back make ``transient_available(nbytes)`` true?"""

    def release(self, buffer: HostBuffer) -> None:
        """Take ``buffer`` back (the entry no longer holds it)."""

    def check(self) -> None:
        """Raise AssertionError if the source's own bookkeeping is broken (the store's debug checks call it)."""


class ArenaSlots:
    """Parameter partitions: pinned arena slots, one size class per partition size. A partition takes a slot of its
    own class only (never a larger class's, which the largest tensor would then lack); with none free it is
    served from pageable fallback memory, counted, and not kept. ``caching``: slots stay as cached copies after
    use (the host cache is on)."""

    bypass = False  # a partition is needed now: evict for it rather than serve it unpinned
    holds_prefixes = False  # a slot per size class: no room between classes to hold part of a partition in

    def spare_bytes(self) -> int:
        return 0

    def __init__(self, pool: BufferPool, caching: bool):
        self.pool = pool
        self.caching = caching

    def try_acquire(self, nbytes: int) -> Optional[HostBuffer]:
        return self.pool.try_acquire(nbytes, own_class_only=True)

    def fallback(self, nbytes: int) -> HostBuffer:
        return self.pool.acquire_pageable(nbytes)

    def try_acquire_idle(self, nbytes: int) -> Optional[HostBuffer]:
        return None  # every slot of a class is a cache slot: none is idle transient memory

    def keeps(self, buffer: HostBuffer) -> bool:
        return self.caching and buffer.slot is not None

    def frees_room_for(self, buffer: HostBuffer, nbytes: int) -> bool:
        return buffer.slot is not None and buffer.capacity_bytes == self.pool.class_bytes(nbytes)

    def room_needed(self, nbytes: int) -> int:
        return self.pool.class_bytes(nbytes)  # one slot of the class

    def transient_available(self, nbytes: int) -> bool:
        return True  # a partition is needed now: pageable fallback memory, counted, rather than a wait

    def frees_transient_room_for(self, buffer: HostBuffer, nbytes: int) -> bool:
        return False

    def release(self, buffer: HostBuffer) -> None:
        self.pool.release(buffer)

    def check(self) -> None:
        self.pool.validate()


class BudgetedPageable:
    """Optimizer state: page-aligned pageable memory (only the CPU optimizer and file I/O touch it, so nothing is
    gained by locking it), kept between uses while ``budget`` has room. Beyond the budget an entry is served from
    a transient buffer that goes back after use: a streaming slot of the pool's arena (the caller reserves them,
    as many as one sub-group needs at once, and may keep them retired until needed: one is brought back when
    none is free), else fresh memory. ``bypass``: once the access order is known, an incoming entry that is
    needed later than every candidate victim is not admitted (Belady with bypass: in the cyclic order of optimizer
    sub-groups the tier then keeps a fixed share instead of cycling everything through)."""

    bypass = True
    holds_prefixes = True  # the budget is bytes: what whole tensors leave of it may hold the first bytes of one

    def spare_bytes(self) -> int:
        return self.budget.available()

    def __init__(self, pool: BufferPool, budget: HostBudget):
        self.pool = pool
        self.budget = budget
        self._budgeted: Dict[int, int] = {}  # ptr -> bytes reserved from the budget

    def try_acquire(self, nbytes: int) -> Optional[HostBuffer]:
        capacity = round_up(nbytes, HOST_PAGE_BYTES)  # what the mapping takes (whole pages), all of it counted
        if not self.budget.try_reserve(capacity):
            return None
        try:
            buffer = self.pool.acquire_pageable(capacity, count_as_fallback=False)
        except BaseException:  # no memory mapped (the kernel refused it): nothing is held, so nothing reserved
            self.budget.release(capacity)
            raise
        self._budgeted[buffer.ptr] = capacity
        return buffer

    def fallback(self, nbytes: int) -> HostBuffer:
        # A streaming slot of the pool's arena when one fits (reused memory: a fresh mapping of a sub-group's size
        # would be zero-filled by page faults on every use), else a fresh mapping.
        slot = self.pool.try_acquire(nbytes)
        size = self.pool.class_bytes(nbytes) if slot is None else None
        if size is not None and self.pool.restore(size, 1):  # a retired slot: memory only once it is needed
            slot = self.pool.try_acquire(nbytes)
        return slot if slot is not None else self.pool.acquire_pageable(nbytes, count_as_fallback=False)

    def try_acquire_idle(self, nbytes: int) -> Optional[HostBuffer]:
        return self.pool.try_acquire(nbytes)  # a free streaming slot in memory (a retired one stays retired)

    def keeps(self, buffer: HostBuffer) -> bool:
        return buffer.ptr in self._budgeted

    def frees_room_for(self, buffer: HostBuffer, nbytes: int) -> bool:
        return buffer.ptr in self._budgeted

    def room_needed(self, nbytes: int) -> int:
        # headroom, not available(): over a total set below what is reserved, the excess must go too
        return max(0, round_up(nbytes, HOST_PAGE_BYTES) - self.budget.headroom())

    def transient_available(self, nbytes: int) -> bool:
        size = self.pool.class_bytes(nbytes)
        if size is None:
            return True  # no streaming slot fits: a fresh mapping is the only way
        slots = self.pool.class_slots().get(size, {"slots": 0, "in_use": 0})
        return slots["slots"] > slots["in_use"]  # free, or retired (brought back by fallback)

    def frees_transient_room_for(self, buffer: HostBuffer, nbytes: int) -> bool:
        return buffer.slot is not None and buffer.capacity_bytes == self.pool.class_bytes(nbytes)

    def release(self, buffer: HostBuffer) -> None:
        reserved = self._budgeted.pop(buffer.ptr, None)
        self.pool.release(buffer)
        if reserved is not None:
            self.budget.release(reserved)

    def check(self) -> None:
        assert sum(self._budgeted.values()) <= self.budget.used_bytes, (self._budgeted, self.budget.used_bytes)
