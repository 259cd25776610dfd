"""Swapped tensors of one dtype in one folder. Owns: each tensor's file, the host buffer that holds its bytes,
the reads and writes between the two, and which clean copies stay in host memory (the host cache). Does not own:
when tensors are needed (DeepSpeed's coordinator, through integrations/deepspeed) or how many slots of each size
exist (plan/size_classes.py).

Plain class: imports torch, not DeepSpeed, so it is tested on its own (tests/cache/test_tensor_store.py).

A tensor's bytes are always on file; a host buffer may hold them too. One ``TensorRecord`` per key:

    on file only --start_read--> reading --wait_read--> in use --release--> cached (clean copy) or on file only
         ^                                                                     |  start_read: hit, no I/O
         +------------------------------ evicted (slot needed) <---------------+
    write_from (not in use): new bytes go into the cached buffer or a free slot, then to the file, asynchronously

Rules that keep bytes right:
- a cached copy always equals the file's newest content: the only way new bytes arrive is ``write_from``, which
  updates the copy it writes from (DeepSpeed never changes a partition between swap-in and release);
- a read from file waits for that key's write in flight (the file is complete before it is read);
- a buffer goes back to the pool only when no read into it or write from it is in flight, and never while in use.
"""
import collections
import dataclasses
import os
import threading
from concurrent.futures import Future
from typing import Callable, Dict, List, Optional

import torch

from ..io.direct_io import DirectFileIO
from ..memory.pool import BufferPool, HostBuffer
from ..profile.recorder import StepRecorder
from ..plan.next_use import NextUseIndex, choose_victim
from ..plan.size_classes import (cache_slot_counts, class_bytes, merge_close_classes, size_histogram,
                                 streaming_slot_counts)


@dataclasses.dataclass(eq=False)
class TensorRecord:
    """One swapped tensor. ``buffer`` holds its bytes (in use, being read, being written, or a cached copy);
    ``keep_buffer`` says whether the buffer may stay after use as a cached copy (an arena slot while the host
    cache is on) or must go back once free (staging and fallback buffers)."""

    key: object
    numel: int
    path: str
    buffer: Optional[HostBuffer] = None
    buffer_pool: Optional[BufferPool] = None
    keep_buffer: bool = False
    in_use: bool = False
    stale_when_released: bool = False  # its owner may have changed the bytes in place: do not cache them
    read: Optional[Future] = None
    write: Optional[Future] = None


class TensorStore:
    """Files plus host buffers for tensors of one dtype. Thread-safe (one re-entrant lock).

    Args:
        folder: where the swap files go, one per key (``<key><file_suffix>``; DeepSpeed's naming by default).
        dtype: element type of every tensor.
        aligned_numel: rounds a numel up to the I/O alignment; files and buffers use the rounded length.
        slots_per_class: streaming slots per size class (see plan/size_classes.py).
        lock: "best_effort" or "required" page-locking of the arena (config "pin_memory").
        io: the I/O engine.
        cache_budget_bytes: host memory for clean copies beyond the streaming slots; 0 is pure streaming.
    """

    def __init__(self, folder: str, dtype: torch.dtype, aligned_numel: Callable[[int], int], slots_per_class: int,
                 lock: str, io: DirectFileIO, cache_budget_bytes: int = 0, file_suffix: str = "_param.tensor.swp"):
        self.folder = folder
        self.dtype = dtype
        self.element_size = torch.empty((), dtype=dtype).element_size()
        self._aligned_numel = aligned_numel
        self._slots_per_class = slots_per_class
        self._file_suffix = file_suffix
        self._io = io
        self.pool = BufferPool("params", lock=lock)
        # Buffers for tensors written once at creation, before all sizes are known: pageable, never counted as
        # arena fallbacks.
        self._staging = BufferPool("param-staging", lock="off")
        self._records: Dict[object, TensorRecord] = {}
        self._cached: "collections.OrderedDict[object, TensorRecord]" = collections.OrderedDict()  # LRU first
        self._writing: Dict[object, TensorRecord] = {}
        self._unplanned_nbytes: List[int] = []
        self._cache_budget_left = cache_budget_bytes
        self.cache_bytes_reserved = 0  # SUM: arena bytes planned for cached copies beyond streaming
        self.caching = cache_budget_bytes > 0
        # Which cached copy to give up: farthest next use in the profiled order (Belady) once it is known,
        # least recently used before that.
        self.recorder = StepRecorder()
        self.next_use: Optional[NextUseIndex] = None
        self._lock = threading.RLock()
        # COUNT stats, protected by _lock
        self.cache_hits = 0
        self.cache_misses = 0
        self.evictions = 0
        self.waits_for_slots = 0

    # ------------------------------------------------------------------------------------------- registry
    def record(self, key, numel: Optional[int] = None) -> TensorRecord:
        """The record of ``key``; registering it (and its size for the next plan) on first sight."""
        with self._lock:
            record = self._records.get(key)
            if record is None:
                assert numel is not None, f"tensor {key} is unknown and no numel was given"
                record = TensorRecord(key, numel, os.path.join(self.folder, f"{key}{self._file_suffix}"))
                self._records[key] = record
                self._unplanned_nbytes.append(self.swap_nbytes(numel))
            return record

    def numels(self) -> List[tuple]:
        """(key, numel) of every registered tensor, sorted: what a profile of this store is recorded for."""
        with self._lock:
            return sorted((key, record.numel) for key, record in self._records.items())

    def active_count(self) -> int:
        """Tensors in use or being read (cached copies and writes in flight do not count)."""
        with self._lock:
            return sum(1 for record in self._records.values() if record.in_use or record.read is not None)

    def swap_nbytes(self, numel: int) -> int:
        return self._aligned_numel(numel) * self.element_size

    def plan(self) -> None:
        """Reserve arena slots for the sizes registered since the last plan: streaming slots, plus cache slots
        from what is left of the cache budget. No-op when nothing new was registered."""
        with self._lock:
            if not self._unplanned_nbytes:
                return
            histogram = merge_close_classes(size_histogram(self._unplanned_nbytes))
            self._unplanned_nbytes = []
            counts = streaming_slot_counts(histogram, self._slots_per_class)
            extra = cache_slot_counts(histogram, counts, self._cache_budget_left)
            self._cache_budget_left -= class_bytes(extra)
            self.cache_bytes_reserved += class_bytes(extra)
            for size, count in extra.items():
                counts[size] += count
            self.pool.add_classes(counts)

    # ------------------------------------------------------------------------------------- creation path
    def staging_view(self, key, numel: int) -> torch.Tensor:
        """A buffer for a new tensor's first bytes; ``write_and_release`` stores it. (DeepSpeed get_buffer.)"""
        with self._lock:
            record = self.record(key, numel)
            assert record.buffer is None, f"tensor {key} already holds a buffer"
            self._attach(record, self._staging.acquire(self.swap_nbytes(numel)), self._staging)
            record.in_use = True
            return record.buffer.view(self.dtype, numel)

    def write_and_release(self, keys) -> None:
        """Write each key's buffer to its file, wait, and let the buffers go."""
        with self._lock:
            records = [self._records[key] for key in keys]
            futures = []
            for record in records:
                assert record.buffer is not None, f"tensor {record.key} has no bytes in memory to write"
                self._wait_write(record)
                futures.append(self._io.write(self._swap_view(record), record.path))
            for future in futures:
                future.result()
            for record in records:
                record.in_use = False
                self._drop_buffer(record)

    # ----------------------------------------------------------------------------------------- read path
    def start_read(self, key, into: Optional[torch.Tensor] = None) -> None:
        """Make ``key`` resident: a cache hit needs no I/O; a miss reads the file into a slot of ours, or into
        the caller's ``into`` (aligned length)."""
        with self._lock:
            record = self._records[key]
            assert not record.in_use and record.read is None, f"tensor {key} is already resident or in flight"
            self.recorder.touch(key)
            if record.buffer is not None:
                self.cache_hits += 1
                self._cached.pop(key, None)
                target = self._swap_view(record)
                if into is not None:
                    into.copy_(target)
                    target = into
                record.read = _done(target)
                return
            self.cache_misses += 1
            self._wait_write(record)
            if into is None:
                self._attach(record, *self._acquire(self.swap_nbytes(record.numel)))
                into = self._swap_view(record)
            record.read = self._io.read(into, record.path)
            record.read.target = into  # whose first numel elements become the tensor

    def wait_read(self, key) -> torch.Tensor:
        """Finish ``key``'s read; returns the resident view of exactly ``numel`` elements."""
        with self._lock:
            record = self._records[key]
            assert record.read is not None, f"tensor {key} has no read in flight"
            future, record.read = record.read, None
            try:
                future.result()
            except BaseException:
                self._drop_buffer(record)  # partial bytes must never be served as a cached copy
                raise
            record.in_use = True
            return future.target.narrow(0, 0, record.numel)

    def read_into(self, key, dest: torch.Tensor) -> None:
        """Synchronously copy ``key``'s bytes into ``dest`` (any CPU tensor of ``numel`` elements)."""
        with self._lock:
            self.start_read(key)
            dest.copy_(self.wait_read(key))
            self.release(key)

    def release(self, key, fence=None) -> None:
        """The caller is done with ``key``'s bytes: keep them as a cached copy or let the buffer go. Idempotent;
        waits for a read still in flight. ``fence`` (a CUDA event) marks the end of device copies that read the
        bytes: the buffer is not overwritten before it has passed."""
        with self._lock:
            record = self._records.get(key)
            if record is None:
                return
            if record.read is not None:
                future, record.read = record.read, None
                try:
                    future.result()
                except BaseException:
                    self._drop_buffer(record)
                    raise
            record.in_use = False
            if record.buffer is not None and fence is not None:
                record.buffer.fence = fence
            if record.stale_when_released:
                record.stale_when_released = False
                if record.write is None:
                    self._cached.pop(key, None)
                    self._drop_buffer(record)
            elif record.buffer is not None and record.keep_buffer:
                self._cached[key] = record
                self._cached.move_to_end(key)
            elif record.write is None:
                self._drop_buffer(record)

    # ---------------------------------------------------------------------------------------- write path
    def write_from(self, key, source: torch.Tensor) -> None:
        """Store ``source`` (cast to our dtype) as ``key``'s new bytes: into its cached copy when there is one,
        else into a slot, then to the file in the background (any later read from file waits for it)."""
        with self._lock:
            record = self._records[key]
            assert not record.in_use and record.read is None, f"tensor {key} is in use or being read"
            self._wait_write(record)
            if record.buffer is None:
                self._attach(record, *self._acquire(self.swap_nbytes(record.numel), for_write=True))
            elif record.buffer.fence is not None:  # a device copy may still be reading the old bytes
                record.buffer.fence.synchronize()
                record.buffer.fence = None
            record.buffer.view(self.dtype, record.numel).copy_(source)
            record.write = self._io.write(self._swap_view(record), record.path)
            self._writing[key] = record
            if record.keep_buffer:
                self._cached[key] = record
                self._cached.move_to_end(key)

    def mark_resident_stale(self) -> None:
        """The tensors in use now may be changed in place by their owner (DeepSpeed's optimizer step copies new
        weights into partitions that are resident, without writing their files, and stock DeepSpeed then drops
        those bytes at release): drop them at release too, so later reads see what stock would."""
        with self._lock:
            for record in self._records.values():
                if record.in_use:
                    record.stale_when_released = True

    def wait_writes(self) -> None:
        """Complete every write in flight."""
        with self._lock:
            for record in list(self._writing.values()):
                self._wait_write(record)

    def wait_write(self, key) -> None:
        with self._lock:
            self._wait_write(self._records[key])

    # --------------------------------------------------------------------------------------------- stats
    def stats(self) -> Dict[str, int]:
        with self._lock:
            stats = self.pool.stats()
            stats.update(cache_hits=self.cache_hits, cache_misses=self.cache_misses, evictions=self.evictions,
                         waits_for_slots=self.waits_for_slots, num_tensors=len(self._records),
                         cached_tensors=len(self._cached),
                         cached_bytes=sum(r.buffer.capacity_bytes for r in self._cached.values()),
                         resident_tensors=sum(1 for r in self._records.values() if r.in_use))
            return stats

    def close(self) -> None:
        self.wait_writes()
        self.pool.close()
        self._staging.close()

    # ------------------------------------------------------------------------------------------- private
    def _swap_view(self, record: TensorRecord) -> torch.Tensor:
        return record.buffer.view(self.dtype, self._aligned_numel(record.numel))

    def _attach(self, record: TensorRecord, buffer: HostBuffer, pool: BufferPool) -> None:
        record.buffer, record.buffer_pool = buffer, pool
        record.keep_buffer = self.caching and pool is self.pool and buffer.slot is not None

    def _acquire(self, nbytes: int, for_write: bool = False):
        """(buffer, pool): a free slot; else the least recently used cached copy that fits gives its slot up;
        else writes in flight are waited for; else pageable fallback memory."""
        buffer = self.pool.try_acquire(nbytes)
        if buffer is None and self._evict_one(nbytes):
            buffer = self.pool.try_acquire(nbytes)
        if buffer is None and self._writing:
            self.waits_for_slots += 1
            self.wait_writes()
            buffer = self.pool.try_acquire(nbytes)
        return (buffer if buffer is not None else self.pool.acquire(nbytes)), self.pool

    def _evict_one(self, nbytes: int) -> bool:
        fitting = [r for r in self._cached.values() if r.buffer.capacity_bytes >= nbytes]
        if not fitting:
            return False
        smallest = min(r.buffer.capacity_bytes for r in fitting)
        best_fitting = [r.key for r in fitting if r.buffer.capacity_bytes == smallest]  # in LRU order
        victim = self._records[choose_victim(best_fitting, self.next_use, self.recorder.position)]
        del self._cached[victim.key]
        self._wait_write(victim)
        self._drop_buffer(victim)
        self.evictions += 1
        return True

    def _wait_write(self, record: TensorRecord) -> None:
        if record.write is None:
            return
        future, record.write = record.write, None
        self._writing.pop(record.key, None)
        future.result()
        if not record.keep_buffer and not record.in_use and record.read is None:
            self._drop_buffer(record)

    def _drop_buffer(self, record: TensorRecord) -> None:
        if record.buffer is not None:
            record.buffer_pool.release(record.buffer)
            record.buffer, record.buffer_pool, record.keep_buffer = None, None, False


def _done(target: torch.Tensor) -> Future:
    future = Future()
    future.set_result(None)
    future.target = target
    return future
