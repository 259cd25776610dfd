"""Swapped tensors of one dtype in one folder. Owns: each tensor's file, the host buffer that holds it while it is
resident, and the reads and writes between the two. Does not own: when tensors are needed (DeepSpeed's
coordinator and the adapters in integrations/deepspeed) or how many slots exist (plan/size_classes.py).

Plain class: imports torch, not DeepSpeed, so it is tested on its own (tests/cache/test_tensor_store.py).

A tensor's life (one ``TensorRecord`` per key):

    registered --read()--> READING --wait_read()--> RESIDENT --release()--> on file only
                                                        ^ write_from() leaves it on file only, with a write in
                                                          flight until the file is complete

Rules that keep bytes right:
- a read of a key waits for that key's in-flight write first (the file is complete before it is read);
- a buffer is never handed back to the pool while a read into it or a write from it is in flight.
"""
import dataclasses
import os
import threading
from concurrent.futures import Future
from typing import Callable, Dict, List, Optional

import torch

from ..io.direct_io import DirectFileIO
from ..memory.pool import BufferPool, HostBuffer
from ..plan.size_classes import merge_close_classes, size_histogram, streaming_slot_counts


@dataclasses.dataclass(eq=False)
class TensorRecord:
    """One swapped tensor. ``buffer`` holds its bytes while resident or being read; ``write`` is the last write
    of its file if it may still be in flight, with ``write_buffer`` the buffer that write reads from."""

    key: object
    numel: int
    path: str
    buffer: Optional[HostBuffer] = None
    buffer_pool: Optional[BufferPool] = None
    read: Optional[Future] = None
    write: Optional[Future] = None
    write_buffer: Optional[HostBuffer] = None


class TensorStore:
    """Files plus host buffers for tensors of one dtype. Thread-safe (one re-entrant lock).

    Args:
        folder: where the swap files go, one per key (``<key>_param.tensor.swp``, DeepSpeed's naming).
        dtype: element type of every tensor.
        aligned_numel: rounds a numel up to the I/O alignment; files and buffers use the rounded length.
        slots_per_class: streaming slots per size class (see plan/size_classes.py).
        lock: "best_effort" or "required" page-locking of the arena (config "pin_memory").
        io: the I/O engine.
    """

    def __init__(self, folder: str, dtype: torch.dtype, aligned_numel: Callable[[int], int], slots_per_class: int,
                 lock: str, io: DirectFileIO, file_suffix: str = "_param.tensor.swp"):
        self.folder = folder
        self.dtype = dtype
        self.element_size = torch.empty((), dtype=dtype).element_size()
        self._aligned_numel = aligned_numel
        self._slots_per_class = slots_per_class
        self._file_suffix = file_suffix
        self._io = io
        self.pool = BufferPool("params", lock=lock)
        # Buffers for tensors that are written once at creation (before sizes are all known): pageable, never
        # counted as arena fallbacks.
        self._staging = BufferPool("param-staging", lock="off")
        self._records: Dict[object, TensorRecord] = {}
        self._unplanned_nbytes: List[int] = []   # sizes registered since the last plan
        self._lock = threading.RLock()
        self.waits_for_slots = 0                 # COUNT: times a read or write waited for a write to free a slot

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

    def swap_nbytes(self, numel: int) -> int:
        return self._aligned_numel(numel) * self.element_size

    def plan(self) -> None:
        """Reserve arena slots for the sizes registered since the last plan (no-op when there are none)."""
        with self._lock:
            if not self._unplanned_nbytes:
                return
            histogram = merge_close_classes(size_histogram(self._unplanned_nbytes))
            self._unplanned_nbytes = []
            self.pool.add_classes(streaming_slot_counts(histogram, self._slots_per_class))

    # ------------------------------------------------------------------------------------- creation path
    def staging_view(self, key, numel: int) -> torch.Tensor:
        """A buffer for a new tensor's first bytes; ``write_and_release`` stores it. (DeepSpeed get_buffer.)"""
        with self._lock:
            record = self.record(key, numel)
            assert record.buffer is None, f"tensor {key} already holds a buffer"
            record.buffer = self._staging.acquire(self.swap_nbytes(numel))
            record.buffer_pool = self._staging
            return record.buffer.view(self.dtype, numel)

    def write_and_release(self, keys) -> None:
        """Write each key's resident buffer to its file, wait, and release the buffers."""
        with self._lock:
            records = [self._records[key] for key in keys]
            futures = []
            for record in records:
                assert record.buffer is not None, f"tensor {record.key} has no bytes in memory to write"
                self._wait_write(record)
                futures.append(self._io.write(self._swap_view(record, record.buffer), record.path))
            for future in futures:
                future.result()
            for record in records:
                self._drop_buffer(record)

    # ----------------------------------------------------------------------------------------- read path
    def start_read(self, key, into: Optional[torch.Tensor] = None) -> None:
        """Start reading ``key`` into a buffer of our own, or into the caller's ``into`` (aligned length)."""
        with self._lock:
            record = self._records[key]
            assert record.buffer is None and record.read is None, f"tensor {key} is already resident or in flight"
            self._wait_write(record)
            if into is None:
                record.buffer, record.buffer_pool = self._acquire(self.swap_nbytes(record.numel)), self.pool
                target = self._swap_view(record, record.buffer)
            else:
                target = into
            record.read = self._io.read(target, record.path)
            record.read.target = target  # the tensor whose first numel elements become the partition

    def wait_read(self, key) -> torch.Tensor:
        """Finish ``key``'s read; returns the resident view of exactly ``numel`` elements."""
        with self._lock:
            record = self._records[key]
            assert record.read is not None, f"tensor {key} has no read in flight"
            future, record.read = record.read, None
            future.result()
            return future.target.narrow(0, 0, record.numel)

    def read_into(self, key, dest: torch.Tensor) -> None:
        """Synchronously copy ``key``'s bytes into ``dest`` (any CPU tensor of ``numel`` elements)."""
        with self._lock:
            self.start_read(key)
            dest.copy_(self.wait_read(key))
            self.release(key)

    def release(self, key) -> None:
        """Forget ``key``'s resident bytes (its file stays). Idempotent; waits for a read still in flight."""
        with self._lock:
            record = self._records.get(key)
            if record is None:
                return
            if record.read is not None:
                future, record.read = record.read, None
                future.result()
            self._drop_buffer(record)

    # ---------------------------------------------------------------------------------------- write path
    def write_from(self, key, source: torch.Tensor) -> None:
        """Store ``source`` (cast to our dtype) as ``key``'s new bytes. Asynchronous: the write completes in the
        background and any later read of ``key`` waits for it."""
        with self._lock:
            record = self._records[key]
            assert record.buffer is None, f"tensor {key} is resident; its owner updates it in place"
            self._wait_write(record)
            buffer = self._acquire(self.swap_nbytes(record.numel), for_write=True)
            buffer.view(self.dtype, record.numel).copy_(source)
            record.write_buffer = buffer
            record.write = self._io.write(self._swap_view(record, buffer), record.path)

    def wait_writes(self) -> None:
        """Complete every write in flight (their buffers go back to the pool)."""
        with self._lock:
            for record in self._records.values():
                self._wait_write(record)

    def wait_write(self, key) -> None:
        with self._lock:
            self._wait_write(self._records[key])

    # --------------------------------------------------------------------------------------------- stats
    def stats(self) -> Dict[str, int]:
        with self._lock:
            stats = self.pool.stats()
            stats["waits_for_slots"] = self.waits_for_slots
            stats["num_tensors"] = len(self._records)
            stats["resident_tensors"] = sum(1 for r in self._records.values() if r.buffer is not None)
            return stats

    def close(self) -> None:
        self.wait_writes()
        self.pool.close()
        self._staging.close()

    # ------------------------------------------------------------------------------------------- private
    def _swap_view(self, record: TensorRecord, buffer: HostBuffer) -> torch.Tensor:
        return buffer.view(self.dtype, self._aligned_numel(record.numel))

    def _acquire(self, nbytes: int, for_write: bool = False) -> HostBuffer:
        """A slot; when none is free, first wait for writes in flight to give theirs back, then fall back."""
        buffer = self.pool.try_acquire(nbytes)
        if buffer is None and any(r.write is not None for r in self._records.values()):
            self.waits_for_slots += 1
            self.wait_writes()
            buffer = self.pool.try_acquire(nbytes)
        return buffer if buffer is not None else self.pool.acquire(nbytes)

    def _wait_write(self, record: TensorRecord) -> None:
        if record.write is None:
            return
        future, record.write = record.write, None
        try:
            future.result()
        finally:
            self.pool.release(record.write_buffer)
            record.write_buffer = None

    def _drop_buffer(self, record: TensorRecord) -> None:
        if record.buffer is not None:
            record.buffer_pool.release(record.buffer)
            record.buffer, record.buffer_pool = None, None
