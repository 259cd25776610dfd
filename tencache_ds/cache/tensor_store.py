"""Parameter partitions of one dtype in one folder: wraps an EntryStore (cache/entry_store.py) whose buffers are
pinned arena slots (cache/buffer_sources.py ``ArenaSlots``) sized from the partition-size histogram. Owns: naming
each partition's file, the arena and planning its slots (streaming slots per size class plus cache slots from this
store's share of the host tier) as new sizes appear, and giving cache slots back (memory pressure, a hand-over).
Does not own: entry states, I/O, eviction (the EntryStore, whose calls it forwards: ``FORWARDED``) or when
partitions are needed (DeepSpeed's coordinator, through integrations/deepspeed/param_swapper.py).

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
                                 snap_to_classes, streaming_slot_counts)
from .buffer_sources import ArenaSlots
from .entry_store import EntryStore
from .entry_store_wrapper import EntryStoreWrapper
from .host_budget import HostBudget


class TensorStore(EntryStoreWrapper):
    """Files plus pinned slots for parameter partitions.

    ``entries`` is the wrapped EntryStore; the calls in ``FORWARDED`` are forwarded to it.

    Args:
        folder: where the swap files go, one per key (``<key><file_suffix>``; DeepSpeed's naming by default).
        dtype: element type of every tensor.
        aligned_numel: rounds a numel up to the I/O alignment; files and buffers use the rounded length.
        slots_per_class: streaming slots per size class (see plan/size_classes.py).
        lock: page-locking of the arena: "off", "best_effort" or "required" (plan/budget.parameter_lock_mode).
        io: the I/O engine.
        cache_budget: the host tier's budget; this store reserves its cache slots from it when it plans. None or
            an empty budget: pure streaming (no copy is kept between uses, changed bytes are written at once).
        lockable_bytes: how many more bytes this process may page-lock now (plan/budget.py; tests pass their own):
            cache slots never take the streaming slots' share of the memlock limit.
    """

    # The EntryStore calls a parameter store's users make (integrations/deepspeed/param_swapper.py, memory
    # pressure, stats, tests), forwarded as they are.
    FORWARDED = frozenset({
        "knows", "state", "kept", "path", "numels", "lent_or_reading", "lendable_without_buffer", "swap_nbytes", "lend",
        "lend_new", "newest_view", "start_read", "prefetch_if_free", "read_done", "wait_read",
        "read_into", "read_newest_into", "release",
        "mark_changed", "mark_all_lent_changed", "store", "write_and_release", "flush", "flush_key", "wait_writes",
        "held_keys", "forget", "check_invariants",
        "recorder", "counters", "name", "dtype", "element_size"})

    def __init__(self, folder: str, dtype: torch.dtype, aligned_numel: Callable[[int], int], slots_per_class: int,
                 lock: str, io: DirectFileIO, cache_budget: Optional[HostBudget] = None,
                 file_suffix: str = "_param.tensor.swp", lockable_bytes: Callable[[], int] = lockable_bytes_now):
        self._lock_mode = lock
        self._lockable_bytes = lockable_bytes
        self._budget = cache_budget if cache_budget is not None else HostBudget(0)
        self._made_with_cache_bytes = self._budget.total_bytes  # (resize_cache lowers the budget: restore_budget)
        self.pool = BufferPool("params", lock=lock)
        # Set once: a store made without a host cache streams for good (its slots keep no copy between uses, but for
        # bytes a failed write still owes), while one made with a cache may keep a copy in any slot, streaming slots
        # too, whatever its budget later.
        self.keeps_copies = self._budget.total_bytes > 0
        super().__init__(EntryStore("params", dtype, aligned_numel, io,
                                    ArenaSlots(self.pool, caching=self.keeps_copies)))
        self.folder = folder
        self._slots_per_class = slots_per_class
        self._file_suffix = file_suffix
        self._unplanned: Dict[Hashable, int] = {}  # key -> swap bytes, registered since the last plan
        self._cache_slots: Dict[int, int] = {}  # slot bytes -> slots planned for cached copies beyond streaming
        self.cache_bytes_reserved = 0  # SUM: bytes of those slots not retired (memory the cache has to give back)

    # ------------------------------------------------------------------------------------------- registry
    def path_of(self, key) -> str:
        return os.path.join(self.folder, f"{key}{self._file_suffix}")

    def staging_view(self, key, numel: int) -> torch.Tensor:
        """A buffer for a new partition's first bytes; ``write_and_release`` stores it. (DeepSpeed get_buffer.)"""
        if not self.entries.knows(key):
            self._unplanned[key] = self.entries.swap_nbytes(numel)
        return self.entries.lend_new(key, numel, self.path_of(key), staging=True)

    def plan(self) -> None:
        """Reserve arena slots for the sizes registered since the last plan: streaming slots, plus cache slots
        from what the host tier's budget has left. No-op when nothing new was registered."""
        if not self._unplanned:
            return
        histogram = merge_close_classes(snap_to_classes(size_histogram(list(self._unplanned.values())),
                                                        self.pool.class_sizes()))
        # a class an earlier plan made keeps its streaming slots: only those it lacks are added (each later plan
        # added a whole set, so a model that gathers a layer at a time under zero.Init got buffer_count slots per
        # class per layer, beyond the budget: helper-235)
        counts = streaming_slot_counts(histogram, self._slots_per_class)
        planned_before = self.pool.class_slots()
        for size in list(counts):
            streaming_before = planned_before.get(size, {}).get("slots", 0) - self._cache_slots.get(size, 0)
            counts[size] = max(0, min(counts[size], self._slots_per_class - streaming_before))
        extra = cache_slot_counts(histogram, counts, self._cache_room(class_bytes(counts)))
        if extra and not self._budget.try_reserve(class_bytes(extra)):
            extra = {}
        planned = dict(counts)
        for size, count in extra.items():
            planned[size] = planned.get(size, 0) + count
        try:
            self.pool.add_classes(planned)
        except BaseException:  # no slots (the kernel refused the mapping, a lock that was required): nothing taken
            self._budget.release(class_bytes(extra))
            raise
        # Recorded once the slots exist: a plan that raised leaves the sizes unplanned and the budget as it was.
        self._unplanned = {}
        self.cache_bytes_reserved += class_bytes(extra)
        for size, count in extra.items():
            self._cache_slots[size] = self._cache_slots.get(size, 0) + count

    def hand_over(self, key) -> None:
        """DeepSpeed keeps ``key``'s bytes in memory of its own from now on (stage 3's ``max_in_cpu`` buffer): forget
        the entry (its buffer goes back, nothing is written). The slots planned for it stay until the caller's
        ``give_back_slots`` once the hand-overs are over (stage 3 hands partitions over one after the other, after
        zero.Init's gathers have planned slots for all): then the partitions still swapped are planned anew, slots
        only for them."""
        self.entries.forget(key)
        self._unplanned.pop(key, None)

    def give_back_slots(self) -> bool:
        """While no partition is lent, in flight or owed to its file: drop the clean copies (their files hold the
        same bytes), unmap the arena and give back the cache budget it took; the partitions are planned anew at the
        next ``plan``. Returns whether it did (False: the slots stay as planned)."""
        with self.entries.exclusive() as store:
            if not store.idle():
                return False
            store.drop_clean_copies()
            if self.pool.stats()["in_use_bytes"]:
                return False
            self._close_pool()
            self._unplanned = store.swap_nbytes_by_key()
            return True

    def restore_budget(self) -> None:
        """The host tier's budget back to what the store was made with, at least: memory pressure lowers it
        (``resize_cache``), and a new engine over a store its last engine put to rest starts a governor of its own,
        which never raises what the old one lowered (helper-235: a rebuilt engine streamed for good)."""
        self._budget.resize(max(self._budget.total_bytes, self._made_with_cache_bytes))

    @property
    def streaming_bytes_reserved(self) -> int:
        """Arena bytes planned for streaming (locked whatever the host cache)."""
        stats = self.pool.stats()
        return stats["reserved_bytes"] - stats["retired_bytes"] - self.cache_bytes_reserved

    @property
    def reducible_cache_bytes(self) -> int:
        """Cache bytes ``resize_cache`` could give back to the kernel: none where CUDA registered the arena, nor
        slots that no eviction frees (a class's slots lent or in I/O beyond its streaming slots: persistent
        parameters stay lent for the run). Counted, they kept the governor from ever finding the tier exhausted:
        each reading "gave back" bytes it could not free, and the OOM killer ended the run (helper-208)."""
        if not self.pool.can_retire:
            return 0
        slots, busy = self.pool.class_slots(), self.entries.busy_slots()
        reducible = 0
        for size, cache_slots in self._cache_slots.items():
            retired = slots[size]["retired"]
            freeable = slots[size]["slots"] - retired - busy.get(size, 0)
            reducible += max(0, min(cache_slots - retired, freeable)) * size
        return reducible

    @property
    def planned_cache_bytes(self) -> int:
        """Bytes of the cache slots planned (retired or not): the most ``resize_cache`` can commit."""
        return class_bytes(self._cache_slots)

    def resize_cache(self, target_bytes: int) -> int:
        """Commit ``target_bytes`` of cache slots from now on (memory pressure, or memory back), within what was
        planned: shrinking retires free cache slots (their memory goes back to the kernel), evicting held
        partitions of those classes first when too few are free (farthest next use first, dirty ones written);
        growing brings retired slots back. Lent partitions keep their slots (released ones are retired at the next
        call). Streaming slots are never touched. Returns the cache bytes committed afterwards: above the target
        when slots are lent, or when the arena cannot give pages back (registered with CUDA: then nothing is
        evicted either, since it would free no memory).

        Locking: shrinking holds the store's lock throughout (a slot freed for retiring must not be taken
        meanwhile); growing does not take it (mlock faults the slots' pages in, milliseconds per 100 MiB, and a
        slot brought back is usable by anyone at once)."""
        target = max(0, int(target_bytes))
        with self.entries.exclusive() as store:
            if target < self.cache_bytes_reserved:
                if self.pool.can_retire:
                    self._budget.resize(target)  # a later plan (new partition sizes) adds no cache slots beyond it
                    self._retire_cache_slots(target)
                    excess = self.cache_bytes_reserved - target
                    if excess > 0:
                        retirable = self._retirable_slots()
                        store.evict_held(excess, lambda buffer: retirable.get(buffer.capacity_bytes, 0) > 0)
                        self._retire_cache_slots(target)
                return self.cache_bytes_reserved
        if target > self.cache_bytes_reserved:
            self._budget.resize(max(self._budget.total_bytes, target))
            self._restore_cache_slots(target)
        return self.cache_bytes_reserved

    def _retirable_slots(self) -> Dict[int, int]:
        """slot bytes -> cache slots of that size not retired yet."""
        slots = self.pool.class_slots()
        return {size: count - slots[size]["retired"] for size, count in self._cache_slots.items()
                if count > slots[size]["retired"]}

    def _retire_cache_slots(self, target: int) -> None:
        """Retire free cache slots until at most ``target`` bytes are committed: the largest that fit the excess
        first, then the smallest that covers what is left (overshooting by less than one slot)."""
        while self.cache_bytes_reserved > target:
            excess = self.cache_bytes_reserved - target
            sizes = sorted(self._retirable_slots())
            fitting = [size for size in sizes if size <= excess]
            covering = [size for size in sizes if size > excess]
            retired = 0
            for size in list(reversed(fitting)) + covering:
                retired = self.pool.retire_free(size, min(self._retirable_slots()[size], max(1, excess // size)))
                if retired:
                    self.cache_bytes_reserved -= retired * size
                    self._budget.release(retired * size)
                    break
            if not retired:
                return  # no free slot in a class with cache slots left: lent, or not retirable (CUDA)

    def _restore_cache_slots(self, target: int) -> None:
        """Bring retired cache slots back while they fit ``target``, smallest first."""
        slots = self.pool.class_slots()
        for size in sorted(self._cache_slots):
            while slots[size]["retired"] > 0 and self.cache_bytes_reserved + size <= target:
                if not self._budget.try_reserve(size):
                    return
                if not self.pool.restore(size, 1):  # the memlock limit stops it: keep what is back
                    self._budget.release(size)
                    return
                slots[size]["retired"] -= 1
                self.cache_bytes_reserved += size

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
                           self.entries.name, lock_room, room, lockable, streaming_bytes)
            room = lock_room
        return room

    def write_from(self, key, source: torch.Tensor) -> None:
        """New weights after an optimizer step (cast to our dtype): kept dirty in the cached slot (write-back), or
        written at once when streaming."""
        self.entries.store(key, source)

    def stats(self):
        stats = self.pool.stats()
        store = self.entries.stats()
        stats.update(store, cache_hits=store["hits"], cache_misses=store["misses"],
                     keeps_copies=int(self.keeps_copies))
        return stats

    def close(self) -> None:
        self.entries.close()
        self._close_pool()

    def _close_pool(self) -> None:
        self.pool.close()
        if self.cache_bytes_reserved:
            self._budget.release(self.cache_bytes_reserved)
            self.cache_bytes_reserved = 0
        self._cache_slots = {}
