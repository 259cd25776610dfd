"""Parameter partitions of one dtype in one folder: an EntryStore (cache/entry_store.py) whose buffers are pinned
arena slots sized from the partition-size histogram. Owns: naming each partition's file, planning the slots
(streaming slots per size class plus cache slots from this store's share of the host tier) as new sizes appear.
Does not own: entry states, I/O, eviction (EntryStore) or when partitions are needed (DeepSpeed's coordinator,
through integrations/deepspeed/param_swapper.py).

Plain class: imports torch, not DeepSpeed (tests/cache/test_tensor_store.py).
"""
import os
from typing import Callable, Dict, Hashable, Optional

import torch

from ..io.direct_io import DirectFileIO
from ..log import logger
from ..memory.pool import BufferPool
from ..plan.budget import UNLIMITED, cache_lock_room, lockable_bytes_now
from ..plan.size_classes import (cache_slot_counts, class_bytes, merge_close_classes, size_histogram,
                                 streaming_slot_counts)
from .entry import EntryState
from .entry_store import ArenaSlots, EntryStore
from .host_budget import HostBudget


class TensorStore(EntryStore):
    """Files plus pinned slots for parameter partitions.

    Args:
        folder: where the swap files go, one per key (``<key><file_suffix>``; DeepSpeed's naming by default).
        dtype: element type of every tensor.
        aligned_numel: rounds a numel up to the I/O alignment; files and buffers use the rounded length.
        slots_per_class: streaming slots per size class (see plan/size_classes.py).
        lock: "best_effort" or "required" page-locking of the arena (config "pin_memory").
        io: the I/O engine.
        cache_budget: the host tier's budget; this store reserves its cache slots from it when it plans. None or
            an empty budget: pure streaming (no copy is kept between uses, changed bytes are written at once).
        lockable_bytes: how many more bytes this process may page-lock now (plan/budget.py; tests pass their own):
            cache slots never take the streaming slots' share of the memlock limit.
    """

    def __init__(self, folder: str, dtype: torch.dtype, aligned_numel: Callable[[int], int], slots_per_class: int,
                 lock: str, io: DirectFileIO, cache_budget: Optional[HostBudget] = None,
                 file_suffix: str = "_param.tensor.swp", lockable_bytes: Callable[[], int] = lockable_bytes_now):
        self._lock_mode = lock
        self._lockable_bytes = lockable_bytes
        self._budget = cache_budget if cache_budget is not None else HostBudget(0)
        super().__init__("params", dtype, aligned_numel, io,
                         ArenaSlots(BufferPool("params", lock=lock), caching=self._budget.total_bytes > 0))
        self.folder = folder
        self.pool = self.source.pool
        self._slots_per_class = slots_per_class
        self._file_suffix = file_suffix
        self._unplanned: Dict[Hashable, int] = {}  # key -> swap bytes, registered since the last plan
        self.cache_bytes_reserved = 0  # SUM: arena bytes planned for cached copies beyond streaming

    # ------------------------------------------------------------------------------------------- registry
    def path_of(self, key) -> str:
        return os.path.join(self.folder, f"{key}{self._file_suffix}")

    def staging_view(self, key, numel: int) -> torch.Tensor:
        """A buffer for a new partition's first bytes; ``write_and_release`` stores it. (DeepSpeed get_buffer.)"""
        if not self.knows(key):
            self._unplanned[key] = self.swap_nbytes(numel)
        return self.lend_new(key, numel, self.path_of(key), staging=True)

    def plan(self) -> None:
        """Reserve arena slots for the sizes registered since the last plan: streaming slots, plus cache slots
        from what the host tier's budget has left. No-op when nothing new was registered."""
        if not self._unplanned:
            return
        histogram = merge_close_classes(size_histogram(list(self._unplanned.values())))
        self._unplanned = {}
        counts = streaming_slot_counts(histogram, self._slots_per_class)
        extra = cache_slot_counts(histogram, counts, self._cache_room(class_bytes(counts)))
        if extra and not self._budget.try_reserve(class_bytes(extra)):
            extra = {}
        self.cache_bytes_reserved += class_bytes(extra)
        for size, count in extra.items():
            counts[size] += count
        self.pool.add_classes(counts)

    def hand_over(self, key) -> None:
        """DeepSpeed keeps ``key``'s bytes in memory of its own from now on (stage 3's ``max_in_cpu`` buffer): forget
        the entry (its buffer goes back, nothing is written). While no partition is lent, in flight or dirty, the
        clean copies of the others are dropped too, the arena and the cache budget it took go back, and the
        partitions still swapped are planned anew at the next ``plan``: slots only for them (stage 3 hands
        partitions over after zero.Init's gathers have planned slots for all)."""
        self.forget(key)
        with self._lock:
            self._unplanned.pop(key, None)
            if self._external_reads or any(entry.state not in (EntryState.ON_FILE, EntryState.CLEAN)
                                           for entry in self._entries.values()):
                return  # a partition is lent, in flight or owed to its file: keep the slots as planned
            for entry in list(self._cached.values()):  # clean copies: their files hold the same bytes
                del self._cached[entry.key]
                self._drop(entry, EntryState.ON_FILE)
            self._checked()
            if self.pool.stats()["in_use_bytes"]:
                return
            self.pool.close()
            if self.cache_bytes_reserved:
                self._budget.release(self.cache_bytes_reserved)
                self.cache_bytes_reserved = 0
            self._unplanned = {other: self.swap_nbytes(entry.numel) for other, entry in self._entries.items()}

    @property
    def streaming_bytes_reserved(self) -> int:
        """Arena bytes planned for streaming (locked whatever the host cache)."""
        return self.pool.stats()["reserved_bytes"] - self.cache_bytes_reserved

    def _cache_room(self, streaming_bytes: int) -> int:
        """The budget left, cut to what the memlock limit leaves after the streaming slots (logged when it cuts)."""
        room = self._budget.available()
        if self._lock_mode == "off" or room <= 0:
            return room
        lockable = self._lockable_bytes()
        lock_room = cache_lock_room(lockable, streaming_bytes)
        if lock_room != UNLIMITED and lock_room < room:
            logger.warning("%s: the host cache gets %d of its %d bytes: the memlock limit lets this process lock %d "
                           "more bytes and the streaming slots take %d (raise `ulimit -l` for more)",
                           self.name, lock_room, room, lockable, streaming_bytes)
            room = lock_room
        return room

    def write_from(self, key, source: torch.Tensor) -> None:
        """New weights after an optimizer step (cast to our dtype): kept dirty in the cached slot (write-back), or
        written at once when streaming."""
        self.store(key, source)

    def stats(self):
        stats = self.pool.stats()
        store = super().stats()
        stats.update(store, cache_hits=store["hits"], cache_misses=store["misses"])
        return stats

    def close(self) -> None:
        super().close()
        self.pool.close()
        if self.cache_bytes_reserved:
            self._budget.release(self.cache_bytes_reserved)
            self.cache_bytes_reserved = 0
