"""Host buffers for swapped tensors. Owns: handing out 4 KiB-aligned buffers that never run out: a slot of the
native arena when one of a fitting size class is free, otherwise pageable fallback memory (counted). Does not
own: how many slots of each size exist (plan/size_classes.py) or when buffers are released (the swappers).

Why a fallback instead of an error: DeepSpeed's retention and prefetch decide how many partitions are resident
at once, not us; stock DeepSpeed asserts ("Not enough buffers 0 for swapping 1") when that exceeds its slots.
A fallback buffer is slower to move to a GPU (not pinned) but keeps training; stats report how often it
happened and how many bytes it peaked at, so a plan that is too small is visible.
"""
import bisect
import dataclasses
import mmap
import threading
from typing import Dict, List, Optional

import torch

from ..units import HOST_PAGE_BYTES, round_up
from .arena import ArenaSlot, PinnedArena


@dataclasses.dataclass(eq=False)
class HostBuffer:
    """One buffer handed out by a BufferPool: ``capacity_bytes`` usable bytes at the 4 KiB-aligned ``ptr``."""

    ptr: int
    capacity_bytes: int
    is_locked: bool
    slot: Optional[ArenaSlot] = None       # set when the buffer is an arena slot
    _base: Optional[torch.Tensor] = None   # uint8 view over the whole buffer (keeps fallback memory alive)
    fence: Optional[object] = None         # a CUDA event after the last device copy that reads the buffer
    counted_as_fallback: bool = True       # pageable buffers only: a missing slot (True) or pageable by design

    def view(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A tensor of ``numel`` elements of ``dtype`` over the start of the buffer (no copy)."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        assert nbytes <= self.capacity_bytes, (nbytes, self.capacity_bytes)
        return self._base[:nbytes].view(dtype)


def _uint8_over(slot: ArenaSlot) -> torch.Tensor:
    return slot.as_tensor(torch.uint8, slot.slot_bytes)


class BufferPool:
    """Arena slots first, pageable fallback second. Thread-safe.

    Invariant: every live HostBuffer is in exactly one of ``_live_arena`` / ``_live_fallback`` (keyed by ptr);
    ``stats()['fallback_bytes_in_use']`` is the sum of the live fallback capacities.
    """

    def __init__(self, name: str, lock: str):
        self.name = name
        self._lock_mode = lock
        self._arenas: List[PinnedArena] = []
        self._mutex = threading.Lock()
        self._live: Dict[int, HostBuffer] = {}
        self._ranges: List[tuple] = []  # sorted (start, end) of every region and live fallback buffer
        self._fences: Dict[int, object] = {}  # slot address -> CUDA event to wait for before reusing it
        self._fallbacks = 0             # COUNT: buffers that came from pageable memory
        self._fallback_in_use = 0       # bytes, current
        self._fallback_peak = 0         # bytes, PEAK
        self._pageable_in_use = 0       # bytes, current: pageable by design (acquire_pageable)

    def add_classes(self, class_counts: Dict[int, int], too_large_remedy: Optional[str] = None) -> None:
        """Reserve a new arena with ``class_counts`` (slot bytes -> count); earlier arenas stay.
        ``too_large_remedy``: what a region that cannot be mapped advises (PinnedArena)."""
        counts = {size: count for size, count in class_counts.items() if count > 0}
        if not counts:
            return
        # A pool that is not locked is not pinned either: registering it with CUDA would page-lock it anyway.
        arena = PinnedArena(counts, lock=self._lock_mode, register_with_cuda=self._lock_mode != "off",
                            name=self.name, too_large_remedy=too_large_remedy)
        with self._mutex:
            self._arenas.append(arena)
            for base, nbytes in arena.regions():
                bisect.insort(self._ranges, (base, base + nbytes))

    def class_sizes(self) -> List[int]:
        """The slot sizes of every class of every arena."""
        with self._mutex:
            return sorted({size for arena in self._arenas for size, _count in arena.classes})

    def class_bytes(self, nbytes: int) -> Optional[int]:
        """The slot size of the smallest class that fits ``nbytes`` (its own class), None if none fits."""
        with self._mutex:
            return min((size for arena in self._arenas for size, _count in arena.classes if size >= nbytes),
                       default=None)

    def try_acquire(self, nbytes: int, own_class_only: bool = False) -> Optional[HostBuffer]:
        """An arena slot of at least ``nbytes``, or None when every fitting class is in use. With
        ``own_class_only`` only a slot of ``nbytes``' own class (``class_bytes``) will do: a small tensor that took
        a larger class's slot would leave the largest tensor without one (it would fall back to pageable memory)."""
        own = self.class_bytes(nbytes) if own_class_only else None
        with self._mutex:
            for arena in self._arenas:
                if own is not None and not _has_free_slot(arena, own):
                    continue  # (an alloc would take a larger class's slot, counted in its peaks: helper-159)
                slot = arena.alloc(nbytes)
                if slot is not None and own is not None and slot.slot_bytes != own:
                    arena.free(slot)
                    slot = None
                if slot is not None:
                    buffer = HostBuffer(slot.ptr, slot.slot_bytes, slot.locked, slot, _uint8_over(slot))
                    self._live[buffer.ptr] = buffer
                    fence = self._fences.pop(buffer.ptr, None)
                    break
            else:
                return None
        if fence is not None:
            # DeepSpeed copies a partition to the device with non_blocking=True and may release it right after;
            # over registered memory that copy really is asynchronous, so wait before anything overwrites it.
            try:
                fence.synchronize()
            except BaseException:  # Ctrl-C in the wait, a device error: the slot goes back with its fence still
                buffer.fence = fence  # owed (no caller ever got it: it was lost for good, helper-211)
                self.release(buffer)
                raise
        return buffer

    def acquire(self, nbytes: int) -> HostBuffer:
        """An arena slot if one fits, else a pageable fallback buffer. Never fails short of host OOM."""
        buffer = self.try_acquire(nbytes)
        return buffer if buffer is not None else self._acquire_fallback(nbytes)

    def acquire_pageable(self, nbytes: int, count_as_fallback: bool = True) -> HostBuffer:
        """A page-aligned pageable buffer outside the arena (zero-filled). ``count_as_fallback`` False for memory
        that is pageable by design (optimizer state), so the fallback counters keep meaning "a slot was missing"."""
        return self._acquire_fallback(nbytes, count_as_fallback)

    def release(self, buffer: HostBuffer) -> None:
        with self._mutex:
            # (not an assert: ``python -O`` drops an assert's expression, and this pop is what frees the buffer)
            if self._live.pop(buffer.ptr, None) is not buffer:
                raise ValueError(f"{self.name}: release of a buffer not handed out")
            if buffer.slot is not None:
                if buffer.fence is not None:
                    self._fences[buffer.ptr] = buffer.fence
                buffer.slot.arena.free(buffer.slot)
            else:
                if buffer.counted_as_fallback:
                    self._fallback_in_use -= buffer.capacity_bytes
                else:
                    self._pageable_in_use -= buffer.capacity_bytes
                self._ranges.remove((buffer.ptr, buffer.ptr + buffer.capacity_bytes))

    def owns(self, tensor: torch.Tensor) -> bool:
        """True when all of ``tensor``'s bytes lie in memory this pool handed out or reserved."""
        if tensor.device.type != "cpu" or tensor.numel() == 0:
            return False
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        with self._mutex:
            index = bisect.bisect_right(self._ranges, (start, float("inf"))) - 1
            return index >= 0 and self._ranges[index][0] <= start and end <= self._ranges[index][1]

    def retire_free(self, slot_bytes: int, count: int) -> int:
        """Give up to ``count`` free slots of ``slot_bytes`` back to the kernel (memory pressure): they stop being
        handed out and their memory is returned (memory/arena.py ``retire``). Returns how many."""
        return self._each_class_of(slot_bytes, count, PinnedArena.retire)

    def restore(self, slot_bytes: int, count: int) -> int:
        """Bring up to ``count`` retired slots of ``slot_bytes`` back. Returns how many."""
        return self._each_class_of(slot_bytes, count, PinnedArena.restore)

    @property
    def can_retire(self) -> bool:
        """Whether slots can give their memory back (not where CUDA registered the regions: memory/arena.py)."""
        with self._mutex:
            return all(arena.can_retire for arena in self._arenas)

    def class_slots(self) -> Dict[int, Dict[str, int]]:
        """slot bytes -> {"slots", "in_use", "retired"} over every arena."""
        out: Dict[int, Dict[str, int]] = {}
        with self._mutex:
            for arena in self._arenas:
                stats = arena.stats()
                for size, _count in arena.classes:
                    totals = out.setdefault(size, {"slots": 0, "in_use": 0, "retired": 0})
                    for key in totals:
                        totals[key] += int(stats[f"class.{size}.{key}"])
        return out

    def free_slots(self) -> int:
        with self._mutex:
            return sum(arena.free_slots() for arena in self._arenas)

    def stats(self) -> Dict[str, int]:
        """Flat numbers: the arenas' totals plus the fallback counters."""
        totals = {"reserved_bytes": 0, "locked_bytes": 0, "registered_bytes": 0, "in_use_bytes": 0,
                  "peak_in_use_bytes": 0, "requested_in_use_bytes": 0, "lock_fallbacks": 0, "num_classes": 0,
                  "retired_bytes": 0}
        with self._mutex:
            for arena in self._arenas:
                arena_stats = arena.stats()
                for key in totals:
                    if key == "num_classes":
                        totals[key] += len(arena.classes)
                    else:
                        totals[key] += int(arena_stats.get(key, 0))
            totals.update(buffer_fallbacks=self._fallbacks, fallback_bytes_in_use=self._fallback_in_use,
                          fallback_bytes_peak=self._fallback_peak, pageable_bytes_in_use=self._pageable_in_use)
        return totals

    def validate(self) -> None:
        """Check every arena's native invariants (raises AssertionError on a bug)."""
        with self._mutex:
            for arena in self._arenas:
                arena.validate()

    def close(self) -> None:
        """Unmap every arena (no slot may be in use). The pool stays usable: add_classes maps new arenas."""
        with self._mutex:
            arenas, self._arenas = self._arenas, []
            regions = {(base, base + nbytes) for arena in arenas for base, nbytes in arena.regions()}
            self._ranges = [span for span in self._ranges if span not in regions]
            inside = {ptr for ptr in self._fences if any(start <= ptr < end for start, end in regions)}
            pending = [self._fences.pop(ptr) for ptr in inside]
        error = None
        for fence in pending:  # a device copy may still read a released slot: its memory goes only after it ended
            try:  # (dropped unwaited until 2026-12-07: helper-159's review)
                fence.synchronize()
            except Exception as err:  # noqa: BLE001  (a sticky device error: the arenas still go, then it is raised)
                error = error or err
        for arena in arenas:
            arena.close()
        if error is not None:
            raise error

    # ---------------------------------------------------------------------------------------------- private
    def _each_class_of(self, slot_bytes: int, count: int, operation) -> int:
        # Outside the pool's mutex: munlock/madvise/mlock of large slots take milliseconds, and the arena is
        # thread-safe on its own. (close() must not race with this, as with every arena call.)
        with self._mutex:
            arenas = list(self._arenas)
        done = 0
        for arena in arenas:
            for index, (size, _count) in enumerate(arena.classes):
                if size == slot_bytes and done < count:
                    done += operation(arena, index, count - done)
        return done

    def _acquire_fallback(self, nbytes: int, count_as_fallback: bool = True) -> HostBuffer:
        # An anonymous mapping is page-aligned (O_DIRECT-safe) and zero-filled, like a fresh arena slot.
        capacity = round_up(max(1, nbytes), HOST_PAGE_BYTES)
        mapping = mmap.mmap(-1, capacity)
        # kept out of fork()ed children (DataLoader workers), as the arena's regions are: an anonymous mapping is
        # shared with them, so giving it back freed nothing while one lived, and the memory governor gave back more
        # and more on readings that did not rise (helper-197)
        if hasattr(mmap, "MADV_DONTFORK"):  # (Linux's)
            mapping.madvise(mmap.MADV_DONTFORK)
        base = torch.frombuffer(mapping, dtype=torch.uint8)
        buffer = HostBuffer(base.data_ptr(), capacity, False, None, base, counted_as_fallback=count_as_fallback)
        with self._mutex:
            self._live[buffer.ptr] = buffer
            bisect.insort(self._ranges, (buffer.ptr, buffer.ptr + capacity))
            if count_as_fallback:
                self._fallbacks += 1
                self._fallback_in_use += capacity
                self._fallback_peak = max(self._fallback_peak, self._fallback_in_use)
            else:
                self._pageable_in_use += capacity
        return buffer


def _has_free_slot(arena, slot_bytes: int) -> bool:
    """Has ``arena`` a slot of the class ``slot_bytes`` neither in use nor retired?"""
    stats, key = arena.stats(), f"class.{slot_bytes}."
    return int(stats.get(key + "slots", 0)) - int(stats.get(key + "in_use", 0)) - int(stats.get(key + "retired", 0)) > 0
