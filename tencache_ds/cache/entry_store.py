"""One host tier of swapped tensors: their files and the host buffers that hold their bytes. Owns: each entry's
state (the machine in cache/entry.py), the reads and writes between buffer and file, which entries stay in host
memory between uses, and which gives its buffer up when another needs one (plan/eviction.py's Belady over the
profiled order, least recently used before the order is known). Does not own: where buffers come from (a ``BufferSource``: arena slots
for parameter partitions, budgeted pageable memory for optimizer state: cache/buffer_sources.py) or when tensors are needed
(DeepSpeed, through integrations/deepspeed).

Zero-copy: a swap-in of a held entry lends its buffer itself (no memcpy); the borrower hands it back with
``release(key, changed=...)``. Write-back: changed bytes reach the file only when the entry is evicted, flushed
(checkpoint, close) or cannot be kept (no room); reads of an entry being written wait for that write alone.

Plain class: torch, not DeepSpeed, so it is tested on its own (tests/cache/test_entry_store.py).

Locking: one lock guards every entry; it is never held while waiting for I/O. A wait releases it, and the state
is looked at again afterwards (another thread may have moved the entry meanwhile).
"""
import collections
import dataclasses
import os
import threading
from concurrent.futures import Future
from typing import Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Set, Tuple

import torch

from ..io.direct_io import DirectFileIO
from ..log import logger
from ..memory.pool import BufferPool, HostBuffer
from ..plan.eviction import bypasses, choose_victim, farthest_first
from ..profile.next_use import NextUseIndex
from ..profile.recorder import StepRecorder
from .entry import (CACHED, HOLDS_BUFFER, IO_IN_FLIGHT, LENT, EntryState, check_transition, lent_state, released)
from .buffer_sources import BufferSource

S = EntryState
DEBUG_CHECKS_ENV = "TENCACHE_DEBUG_CHECKS"  # "1": check_invariants() after every public call (tests turn it on)


# ----------------------------------------------------------------------------------------------------- entries
@dataclasses.dataclass(eq=False)
class Entry:
    """One swapped tensor. ``buffer`` is set in every state but ON_FILE; ``io`` is the read or write in flight
    (READING, WRITING); ``kept``: the buffer may stay after use (else it goes back once the bytes are safe);
    ``evicting``: a WRITING entry gives its buffer up when the write is done (else it stays CLEAN)."""

    key: Hashable
    numel: int
    path: str
    state: EntryState = S.ON_FILE
    buffer: Optional[HostBuffer] = None
    kept: bool = False
    io: Optional[Future] = None
    evicting: bool = False
    staged: bool = False  # the buffer is a one-time staging buffer (lend_new(staging=True))


@dataclasses.dataclass
class StoreCounters:
    """COUNT since start, protected by the store's lock."""

    hits: int = 0            # a lend served from a held buffer: no I/O, no copy
    misses: int = 0          # a lend that read the file
    evictions: int = 0       # held buffers given up for another entry
    written_back: int = 0    # writes of changed bytes (evictions, flushes, entries that could not be kept)
    bypassed: int = 0        # entries not admitted (served transiently) because every victim was needed sooner
    waits_for_slots: int = 0  # acquisitions that waited for one write to free a buffer
    transient_buffers: int = 0  # entries served from a transient buffer (not kept after use)
    write_errors: int = 0    # writes that failed (the entry kept its bytes, DIRTY)
    io_wait_s: float = 0.0   # time callers were blocked on this store's reads and writes
    prefetch_issued: int = 0  # reads started ahead of their use (start_read(prefetch=True) of a miss)
    prefetch_late: int = 0   # ... not finished when wait_read came


class EntryStore:
    """Files plus host buffers for tensors of one dtype, each an ``Entry`` in the state machine of cache/entry.py.

    Args:
        name: for messages.
        dtype: element type of every tensor.
        aligned_numel: rounds a numel up to the I/O alignment; files and buffers use the rounded length.
        io: the I/O engine.
        source: where buffers come from (cache/buffer_sources.py).
    """

    def __init__(self, name: str, dtype: torch.dtype, aligned_numel: Callable[[int], int], io: DirectFileIO,
                 source: BufferSource):
        self.name = name
        self.dtype = dtype
        self.element_size = torch.empty((), dtype=dtype).element_size()
        self._aligned_numel = aligned_numel
        self._io = io
        self.source = source
        self._staging = BufferPool(f"{name}-staging", lock="off")  # first bytes of new tensors, before any plan
        self._entries: Dict[Hashable, Entry] = {}
        self._count = collections.Counter()  # EntryState -> entries in it (no scans on hot paths)
        self._cached: "collections.OrderedDict[Hashable, Entry]" = collections.OrderedDict()  # kept, not lent; LRU
        self._writing: Dict[Hashable, Entry] = {}
        self._external_reads: Dict[Hashable, Future] = {}  # reads into a caller's buffer (no entry buffer)
        self.recorder = StepRecorder()
        self.next_use: Optional[NextUseIndex] = None
        self.counters = StoreCounters()
        self._prefetched: Set[Hashable] = set()  # prefetch reads not yet waited for
        # prefetched keys not yet used -> [read issued at, read done at] (clock; None: no read, a hit)
        self._deferred_uses: Dict[Hashable, Optional[list]] = {}
        self.debug_checks = os.environ.get(DEBUG_CHECKS_ENV) == "1"
        self._lock = threading.Lock()

    # --------------------------------------------------------------------------------------------- registry
    def add(self, key, numel: int, path: str) -> None:
        """Register ``key`` whose bytes are already on file at ``path`` (no-op if known)."""
        with self._lock:
            if key not in self._entries:
                self._new_entry(key, numel, path, S.ON_FILE)

    def knows(self, key) -> bool:
        with self._lock:
            return key in self._entries

    def state(self, key) -> Optional[EntryState]:
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry.state

    def kept(self, key) -> bool:
        """Does ``key``'s buffer stay in host memory after use (False: transient, or no buffer)?"""
        with self._lock:
            entry = self._entries.get(key)
            return entry is not None and entry.buffer is not None and entry.kept

    def path(self, key) -> str:
        with self._lock:
            return self._entries[key].path

    def numels(self) -> List[tuple]:
        """(key, numel) of every entry, sorted: what a profile of this store is recorded for."""
        with self._lock:
            return sorted(((key, entry.numel) for key, entry in self._entries.items()), key=repr)

    def lent_or_reading(self) -> int:
        """Entries lent out or being read (a counter, not a scan: the coordinator asks on every module fetch)."""
        with self._lock:
            return self._count[S.LENT_CLEAN] + self._count[S.LENT_DIRTY] + self._count[S.READING]

    def swap_nbytes(self, numel: int) -> int:
        return self._aligned_numel(numel) * self.element_size

    # ------------------------------------------------------------------------------------------ lending
    def lend_new(self, key, numel: int, path: str, staging: bool = False) -> torch.Tensor:
        """A buffer for ``key``'s new bytes, whole (the old ones, if any, are not read): the caller fills it and
        releases it with ``changed=True``. ``staging``: a one-time pageable buffer (zero.Init's first write of each
        partition, before any size is planned). Returns a view of exactly ``numel`` elements."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and (entry.numel, entry.path) != (numel, path):
                self._forget_locked(entry)  # a new tensor under an old key (a rebuilt model): the old bytes go
                entry = None
            if entry is None:
                entry = self._new_entry(key, numel, path, S.ON_FILE)
            self._settle(entry)
            if entry.state in LENT or entry.state == S.READING:
                raise RuntimeError(f"{self.name}: tensor {key} is already lent or being read")
            if entry.state == S.ON_FILE:
                if staging:
                    self._attach(entry, self._staging.acquire_pageable(self.swap_nbytes(numel), False), False)
                    entry.staged = True
                else:
                    self._attach(entry, *self._acquire(self.swap_nbytes(numel), key))
            else:
                self._cached.pop(key, None)
                self._fence(entry.buffer)
            self._set(entry, S.LENT_DIRTY)
            view = self._compute_view(entry)
            self._checked()
            return view

    def start_read(self, key, into: Optional[torch.Tensor] = None, prefetch: bool = False) -> None:
        """Begin lending ``key``: a held entry is a hit (no I/O); otherwise its file is read into a buffer of ours,
        or into the caller's ``into`` (aligned length; the entry then stays on file). ``wait_read`` finishes.
        ``prefetch``: the use is still ahead (counted as a prefetch, and as late if wait_read has to wait)."""
        with self._lock:
            entry = self._entries[key]
            self._settle(entry)
            if entry.state in LENT or entry.state == S.READING or key in self._external_reads:
                raise RuntimeError(f"{self.name}: tensor {key} is already lent or being read")
            # The profile records uses: a prefetch is recorded when wait_read hands it over, so reading ahead
            # never changes the recorded order.
            access = None if prefetch else self.recorder.touch(key, self.swap_nbytes(entry.numel))
            if prefetch:
                self._deferred_uses[key] = None
            if entry.state in CACHED:
                self.counters.hits += 1
                if into is not None:  # the caller wants its own copy; ours stays cached
                    into.narrow(0, 0, entry.numel).copy_(self._compute_view(entry))
                    self._external_reads[key] = _done(into)
                else:
                    self._cached.pop(key)
                    self._set(entry, lent_state(entry.state))
                self._checked()
                return
            self.counters.misses += 1
            if prefetch:
                self.counters.prefetch_issued += 1
                self._prefetched.add(key)
            if into is not None:
                timer = self._read_timer(key, access)
                self._external_reads[key] = self._io.read(into, entry.path, nbytes=self.swap_nbytes(entry.numel))
                self._external_reads[key].target = into
                self._external_reads[key].add_done_callback(timer)
                return
            self._attach(entry, *self._acquire(self.swap_nbytes(entry.numel), key, use_pending=prefetch))
            timer = self._read_timer(key, access)  # after _acquire: its waits are stalls, not read time
            entry.io = self._io.read(self._swap_view(entry), entry.path)
            entry.io.add_done_callback(timer)
            self._set(entry, S.READING)
            self._checked()

    def prefetch_if_free(self, key) -> bool:
        """Start reading ``key`` ahead of its use if it is on file and a buffer is free right now: never waits,
        never evicts (a prefetch must not stall the caller or push out what is needed sooner). False if not
        started. The use that follows is ``wait_read`` (the profile records it then)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.state != S.ON_FILE or key in self._external_reads:
                return False
            self._reap_writes()
            buffer = self.source.try_acquire(self.swap_nbytes(entry.numel))
            if buffer is None:
                return False
            self.counters.misses += 1
            self.counters.prefetch_issued += 1
            self._prefetched.add(key)
            self._attach(entry, buffer, self.source.keeps(buffer))
            timer = self._read_timer(key, None)
            entry.io = self._io.read(self._swap_view(entry), entry.path)
            entry.io.add_done_callback(timer)
            self._set(entry, S.READING)
            self._checked()
            return True

    def read_done(self, key) -> bool:
        """True unless a read of ``key`` is still in flight."""
        with self._lock:
            entry = self._entries.get(key)
            future = self._external_reads.get(key) or (entry.io if entry is not None and entry.state == S.READING
                                                       else None)
            return future is None or future.done()

    def wait_read(self, key) -> torch.Tensor:
        """Finish lending ``key``; returns the lent view of exactly ``numel`` elements. A failed read raises its
        error and leaves the entry on file (partial bytes are never served)."""
        with self._lock:
            if key in self._prefetched:
                self._prefetched.discard(key)
                in_flight = self._external_reads.get(key) or self._entries[key].io
                self.counters.prefetch_late += in_flight is not None and not in_flight.done()
            try:
                external = self._external_reads.pop(key, None)
                if external is not None:
                    error = self._wait_unlocked(external)
                    if error is not None:
                        raise error
                    return external.target.narrow(0, 0, self._entries[key].numel)
                entry = self._entries[key]
                if entry.state == S.READING:
                    self._wait_unlocked(entry.io)
                    self._finish_io(entry)  # raises the read's error, entry back ON_FILE
                if entry.state not in LENT:
                    raise RuntimeError(f"{self.name}: tensor {key} has no read in flight ({entry.state.value})")
                view = self._compute_view(entry)
                self._checked()
                return view
            finally:
                self._record_deferred_use(key)

    def lend(self, key) -> torch.Tensor:
        self.start_read(key)
        return self.wait_read(key)

    def read_into(self, key, dest: torch.Tensor) -> None:
        """Copy ``key``'s newest bytes into ``dest`` (``numel`` elements of any CPU tensor) without lending."""
        self.start_read(key)
        dest.copy_(self.wait_read(key))
        self.release(key)

    def release(self, key, changed: bool = False, fence=None) -> None:
        """The borrower is done with ``key`` (``changed``: it wrote to the bytes). The entry stays held if its
        buffer may be kept, else its bytes go to the file first when they are owed. Idempotent; a read still in
        flight is finished first. ``fence`` (a CUDA event) marks the end of device copies reading the bytes."""
        with self._lock:
            self._prefetched.discard(key)  # released unused: neither used nor late, nor recorded
            self._deferred_uses.pop(key, None)
            external = self._external_reads.pop(key, None)
            if external is not None:
                self._wait_unlocked(external)
            entry = self._entries.get(key)
            if entry is None:
                return
            if entry.state == S.READING:
                self._wait_unlocked(entry.io)
                self._finish_io(entry)
            if entry.state not in LENT:
                return
            if changed and entry.state == S.LENT_CLEAN:
                self._set(entry, S.LENT_DIRTY)
            if fence is not None:
                entry.buffer.fence = fence
            if entry.kept:
                self._set(entry, released(entry.state))
            elif entry.state == S.LENT_CLEAN:
                self._drop(entry, S.ON_FILE)
            else:
                self._start_write(entry, evicting=True)  # no room to keep it: to the file, then the buffer goes
            self._checked()

    def mark_changed(self, key) -> None:
        """The borrower changed ``key``'s lent bytes (they are now the newest)."""
        with self._lock:
            entry = self._entries[key]
            if entry.state == S.LENT_CLEAN:
                self._set(entry, S.LENT_DIRTY)

    def mark_all_lent_changed(self) -> None:
        """Every lent entry may have been changed in place by its borrower (stage 3 copies new weights into
        partitions it holds at the optimizer step without calling us): treat their bytes as the newest."""
        with self._lock:
            for entry in self._entries.values():
                if entry.state == S.LENT_CLEAN:
                    self._set(entry, S.LENT_DIRTY)

    # ---------------------------------------------------------------------------------------------- writing
    def store(self, key, source: torch.Tensor) -> None:
        """``source`` (cast to our dtype) becomes ``key``'s newest bytes: into its held buffer or a new one, kept
        dirty (write-back), or written now when it cannot be kept."""
        with self._lock:
            entry = self._entries[key]
            self._settle(entry)
            if entry.state in LENT or entry.state == S.READING:
                raise RuntimeError(f"{self.name}: tensor {key} is lent or being read")
            if entry.state == S.ON_FILE:
                self._attach(entry, *self._acquire(self.swap_nbytes(entry.numel), key))
            else:
                self._cached.pop(key, None)
                self._fence(entry.buffer)
            self._set(entry, S.LENT_DIRTY)  # held by us for the copy
        self._compute_view(entry).copy_(source)
        self.release(key)

    def write_parts(self, key, numel: int, path: str, parts: Sequence[Tuple[int, torch.Tensor]]) -> None:
        """Place each (element offset, tensor) of ``parts`` into ``key``'s bytes, the rest left as it was (stage 3
        stores a sub-group's gradient fragments reduce bucket by reduce bucket). Held: copied into the buffer, no
        I/O. On file: written at their offsets, nothing read back. New: a buffer, zeros between the parts (a new
        file is sparse). Recorded as one use in every case: the recorded order must not depend on what the tier
        happens to hold, or the profile would stop predicting the step as soon as the tier follows it."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._settle(entry)
                if entry.state in LENT or entry.state == S.READING:
                    raise RuntimeError(f"{self.name}: tensor {key} is lent or being read")
                if entry.state == S.ON_FILE:
                    self.recorder.touch(key, self.swap_nbytes(entry.numel))
                    writes = [self._io.write(part.reshape(-1).to(device="cpu", dtype=self.dtype).contiguous(),
                                             entry.path, file_offset=offset * self.element_size)
                              for offset, part in parts]
                    errors = [self._wait_unlocked(write) for write in writes]
                    self._raise_first(errors)  # the bytes are owed to the file: never dropped quietly
                    return
                self.recorder.touch(key, self.swap_nbytes(entry.numel))
                self.counters.hits += 1
                self._cached.pop(key)
                self._fence(entry.buffer)
                self._set(entry, S.LENT_DIRTY)
                view = self._compute_view(entry)
        if entry is None:
            view = self.lend_new(key, numel, path)
            with self._lock:
                self.recorder.touch(key, self.swap_nbytes(numel))
            view.zero_()
        for offset, part in parts:
            view.narrow(0, offset, part.numel()).copy_(part.reshape(-1))
        self.release(key, changed=True)

    @staticmethod
    def _raise_first(errors: Sequence[Optional[BaseException]]) -> None:
        for error in errors:
            if error is not None:
                raise error

    def write_and_release(self, keys: Iterable) -> None:
        """Write each lent key's bytes (new, or changed by the borrower) to its file, wait, and let the buffers go
        (zero.Init's first write of a partition, and its re-partitioning after a gathered parameter was modified)."""
        with self._lock:
            entries = [self._entries[key] for key in keys]
            for entry in entries:
                if entry.state == S.READING:
                    self._wait_unlocked(entry.io)
                    self._finish_io(entry)
                if entry.state not in LENT:
                    raise RuntimeError(f"{self.name}: tensor {entry.key} is not lent ({entry.state.value})")
                if entry.state == S.LENT_CLEAN:
                    self._set(entry, S.LENT_DIRTY)
                self._start_write(entry, evicting=True)
            for entry in entries:
                self._wait_write(entry)
            self._checked()

    def flush(self, skip: Optional[Callable[[Hashable], bool]] = None) -> int:
        """Write every dirty held entry to its file and wait; they stay held, clean. Returns how many were
        written. Lent entries must have been released (a checkpoint is taken between steps). ``skip(key)``: leave
        that entry dirty (a checkpoint does not need it)."""
        with self._lock:
            lent_dirty = [entry.key for entry in self._entries.values() if entry.state == S.LENT_DIRTY]
            if lent_dirty:
                raise RuntimeError(f"{self.name}: cannot flush while tensors {lent_dirty[:5]} are lent and changed")
            dirty = [entry for entry in self._entries.values()
                     if entry.state == S.DIRTY and (skip is None or not skip(entry.key))]
            for entry in dirty:
                self._start_write(entry, evicting=False)
            for entry in list(self._writing.values()):
                self._wait_write(entry)
            self._checked()
            return len(dirty)

    def flush_key(self, key) -> None:
        """Make ``key``'s file hold its newest bytes (a reader outside the store is about to open it)."""
        with self._lock:
            entry = self._entries[key]
            if entry.state == S.LENT_DIRTY:
                raise RuntimeError(f"{self.name}: cannot flush tensor {key} while it is lent and changed")
            if entry.state == S.DIRTY:
                self._start_write(entry, evicting=False)
            self._wait_write(entry)

    def wait_writes(self) -> None:
        """Wait for the writes in flight (none is started): the transient buffers they were writing from go back.
        Raises a failed write's error (its bytes stay held, owed to the file)."""
        with self._lock:
            for entry in list(self._writing.values()):
                self._wait_write(entry)
            self._checked()

    # ------------------------------------------------------------------------------------ giving memory back
    def kept_bytes(self) -> int:
        """Bytes of buffers the tier keeps between uses (held now, or lent and to be held again at release)."""
        with self._lock:
            return self._kept_bytes_locked()

    def trim_kept(self, target_bytes: int) -> int:
        """Keep at most ``target_bytes`` of buffers from now on (memory pressure): held entries go, the one needed
        farthest ahead first (least recently used before the order is known), dirty ones written first; if that is
        not enough, lent entries are no longer kept and go when released. Returns the kept bytes left."""
        with self._lock:
            self._reap_writes()
            excess = self._kept_bytes_locked() - max(0, int(target_bytes))
            excess -= self._evict_held_locked(excess, lambda buffer: True)
            lent = [entry.key for entry in self._entries.values() if entry.state in LENT and entry.kept]
            index = self.next_use if self.recorder.on_track else None
            for key in farthest_first(lent, index, self.recorder.position):
                if excess <= 0:
                    break
                self._entries[key].kept = False  # released into a write and a drop, not into the cache
                excess -= self._entries[key].buffer.capacity_bytes
            self._checked()
            return self._kept_bytes_locked()

    def _evict_held_locked(self, nbytes: int, may_give_back: Callable[[HostBuffer], bool]) -> int:
        """Evict held entries whose buffers ``may_give_back`` until at least ``nbytes`` of buffers are freed (fewer
        when there are not enough): farthest next use first; the dirty ones' writes run together and are waited
        for. Returns the bytes freed."""
        candidates = [entry.key for entry in self._cached.values() if may_give_back(entry.buffer)]
        index = self.next_use if self.recorder.on_track else None
        victims, freed = [], 0
        for key in farthest_first(candidates, index, self.recorder.position):
            if freed >= nbytes:
                break
            victims.append(self._entries[key])
            freed += self._entries[key].buffer.capacity_bytes
        for victim in victims:
            self.counters.evictions += 1
            if victim.state == S.CLEAN:
                self._drop(victim, S.ON_FILE)
            else:
                self._start_write(victim, evicting=True)
        for victim in victims:
            self._wait_write(victim)
        return freed

    def _kept_bytes_locked(self) -> int:
        return sum(entry.buffer.capacity_bytes for entry in self._entries.values()
                   if entry.buffer is not None and entry.kept)

    def forget(self, key) -> None:
        """Drop ``key``'s entry without writing (its file was replaced by someone else); unknown keys are ignored."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._forget_locked(entry)
                self._checked()

    def _forget_locked(self, entry: Entry) -> None:
        if entry.state in LENT:
            raise RuntimeError(f"{self.name}: cannot forget tensor {entry.key}: it is lent")
        self._prefetched.discard(entry.key)
        self._deferred_uses.pop(entry.key, None)
        if entry.state in IO_IN_FLIGHT:
            self._wait_unlocked(entry.io)
        if entry.buffer is not None:
            self._release_buffer(entry)
        self._cached.pop(entry.key, None)
        self._writing.pop(entry.key, None)
        self._count[entry.state] -= 1
        del self._entries[entry.key]

    def held_keys(self) -> List[Hashable]:
        """Keys whose bytes are in host memory and not lent (clean or dirty copies)."""
        with self._lock:
            return list(self._cached)

    def forget_all(self) -> None:
        """Drop every entry without writing (the files were replaced, e.g. by a checkpoint load)."""
        with self._lock:
            for entry in list(self._entries.values()):
                self._forget_locked(entry)
            self._checked()

    # ---------------------------------------------------------------------------------------------- checks
    def check_invariants(self) -> None:
        """Raise AssertionError if any invariant of the store is broken (tests run it after every call)."""
        with self._lock:
            self._check_invariants_locked()

    def _check_invariants_locked(self) -> None:
        counts = collections.Counter(entry.state for entry in self._entries.values())
        assert counts == +self._count, (dict(counts), dict(self._count))
        for key, entry in self._entries.items():
            assert (entry.buffer is not None) == (entry.state in HOLDS_BUFFER), (key, entry.state)
            assert (entry.io is not None) == (entry.state in IO_IN_FLIGHT), (key, entry.state)
            assert (key in self._cached) == (entry.state in CACHED), (key, entry.state, entry.kept)
            assert (key in self._writing) == (entry.state == S.WRITING), (key, entry.state)
            if entry.state in CACHED:
                assert entry.kept, (key, "a buffer that may not be kept is held between uses")
            if entry.buffer is not None:
                assert entry.buffer.capacity_bytes >= self.swap_nbytes(entry.numel), key
        self.source.check()

    # ----------------------------------------------------------------------------------------------- stats
    def stats(self) -> Dict[str, int]:
        with self._lock:
            held = [entry for entry in self._entries.values() if entry.state in CACHED]
            kept_bytes = sum(entry.buffer.capacity_bytes for entry in self._entries.values()
                             if entry.buffer is not None and entry.kept)
            return {"hits": self.counters.hits, "misses": self.counters.misses,
                    "evictions": self.counters.evictions, "written_back": self.counters.written_back,
                    "bypassed": self.counters.bypassed, "waits_for_slots": self.counters.waits_for_slots,
                    "transient_buffers": self.counters.transient_buffers, "write_errors": self.counters.write_errors,
                    "io_wait_s": self.counters.io_wait_s, "prefetch_issued": self.counters.prefetch_issued,
                    "prefetch_late": self.counters.prefetch_late,
                    "num_tensors": len(self._entries), "cached_tensors": len(held),
                    "cached_bytes": sum(entry.buffer.capacity_bytes for entry in held),
                    "kept_bytes": kept_bytes,  # held or lent from a buffer the tier keeps
                    "dirty_tensors": self._count[S.DIRTY] + self._count[S.LENT_DIRTY],
                    "resident_tensors": self._count[S.LENT_CLEAN] + self._count[S.LENT_DIRTY]}

    def close(self) -> None:
        """Wait for I/O in flight and give every buffer back (dirty bytes are not written: flush first)."""
        self.forget_all()
        self._staging.close()

    # ---------------------------------------------------------------------------------------------- private
    def _new_entry(self, key, numel: int, path: str, state: EntryState) -> Entry:
        entry = Entry(key, numel, path, state)
        self._entries[key] = entry
        self._count[state] += 1
        return entry

    def _set(self, entry: Entry, new: EntryState) -> None:
        old = entry.state
        check_transition(entry.key, old, new)
        entry.state = new
        self._count[old] -= 1
        self._count[new] += 1
        if new in CACHED:
            self._cached[entry.key] = entry
            self._cached.move_to_end(entry.key)
        else:
            self._cached.pop(entry.key, None)
        if new == S.WRITING:
            self._writing[entry.key] = entry
        else:
            self._writing.pop(entry.key, None)

    def _checked(self) -> None:
        if self.debug_checks:
            self._check_invariants_locked()

    def _swap_view(self, entry: Entry) -> torch.Tensor:
        return entry.buffer.view(self.dtype, self._aligned_numel(entry.numel))

    def _compute_view(self, entry: Entry) -> torch.Tensor:
        return entry.buffer.view(self.dtype, entry.numel)

    def _attach(self, entry: Entry, buffer: HostBuffer, kept: bool) -> None:
        entry.buffer, entry.kept = buffer, kept

    def _release_buffer(self, entry: Entry) -> None:
        buffer, staged = entry.buffer, entry.staged
        entry.buffer, entry.kept, entry.staged = None, False, False
        (self._staging if staged else self.source).release(buffer)

    def _drop(self, entry: Entry, new: EntryState) -> None:
        self._release_buffer(entry)
        entry.io, entry.evicting = None, False
        self._set(entry, new)

    @staticmethod
    def _fence(buffer: HostBuffer) -> None:
        if buffer.fence is not None:  # a device copy may still be reading the old bytes
            buffer.fence.synchronize()
            buffer.fence = None

    def _start_write(self, entry: Entry, evicting: bool) -> None:
        self._fence(entry.buffer)
        entry.io = self._io.write(self._swap_view(entry), entry.path)
        entry.evicting = evicting
        self.counters.written_back += 1
        self._set(entry, S.WRITING)

    def _wait_write(self, entry: Entry) -> None:
        """Wait for ``entry``'s write (lock released meanwhile) and apply its outcome; raises a failed write's
        error with the entry DIRTY again (its bytes are kept, still owed to the file)."""
        if entry.state != S.WRITING:
            return
        self._wait_unlocked(entry.io)
        self._finish_io(entry)

    def _finish_io(self, entry: Entry, raise_error: bool = True) -> None:
        """Apply the outcome of ``entry``'s finished read or write (no-op if another thread already did). A failed
        write leaves the entry DIRTY (retried at its next eviction or flush); ``raise_error`` False when the caller
        is not the one that needed the write (the error is logged and counted, and raised by that retry)."""
        if entry.state not in IO_IN_FLIGHT or not entry.io.done():
            return
        error = entry.io.exception()
        if entry.state == S.READING:
            if error is not None:
                self._drop(entry, S.ON_FILE)
                raise error
            entry.io = None
            self._set(entry, S.LENT_CLEAN)
            return
        if error is not None:
            entry.io, entry.evicting = None, False
            if not entry.kept:  # a transient buffer holding owed bytes: keep it, counted as held
                entry.kept = True
            self._set(entry, S.DIRTY)
            self.counters.write_errors += 1
            if raise_error:
                raise error
            logger.warning("%s: writing %s failed (%s); its bytes stay in host memory and the write is retried "
                           "when it is evicted or flushed", self.name, entry.path, error)
            return
        if entry.evicting or not entry.kept:
            self._drop(entry, S.ON_FILE)
        else:
            entry.io = None
            self._set(entry, S.CLEAN)

    def _settle(self, entry: Entry) -> None:
        """Before using ``entry``: finish its write if one is in flight (reads of it wait for that write only)."""
        if entry.state == S.WRITING:
            self._wait_write(entry)

    def _reap_writes(self) -> None:
        """Apply the outcome of writes that finished on their own (frees their buffers); never waits."""
        for entry in [entry for entry in self._writing.values() if entry.io.done()]:
            self._finish_io(entry, raise_error=False)

    def _read_timer(self, key, access: Optional[int]) -> Callable[[Future], None]:
        """The done-callback that times ``key``'s read: into the recorded access, or, for a prefetch whose use is
        recorded later, into its deferred-use record."""
        if access is not None:
            return self.recorder.read_timer(access)
        clock, times = self.recorder.clock, [self.recorder.clock(), None]
        self._deferred_uses[key] = times

        def finished(future: Future) -> None:
            times[1] = clock()  # one list element: atomic under the GIL, read under the lock at use
        return finished

    def _record_deferred_use(self, key) -> None:
        if key not in self._deferred_uses:
            return
        times = self._deferred_uses.pop(key)
        entry = self._entries.get(key)
        access = self.recorder.touch(key, self.swap_nbytes(entry.numel) if entry is not None else 0)
        if times is not None:
            done = times[1] if times[1] is not None else self.recorder.clock()
            self.recorder.read_took(access, done - times[0])

    def _wait_unlocked(self, future: Future) -> Optional[BaseException]:
        if not future.done():
            started = self.recorder.clock()
            self._lock.release()
            try:
                _wait_quietly(future)
            finally:
                self._lock.acquire()
            waited = self.recorder.clock() - started
            self.counters.io_wait_s += waited
            self.recorder.stalled(waited)  # the profile's compute excludes I/O waits
        return future.exception()

    def _acquire(self, nbytes: int, incoming, use_pending: bool = False) -> tuple:
        """(buffer, kept) for ``nbytes`` of entry ``incoming``: a free buffer from the source; else a held entry
        gives its buffer up (Belady victim; a dirty one is written first, and only its write is waited for);
        else a write in flight that frees a fitting buffer is waited for; else a transient buffer.
        ``use_pending``: the read is a prefetch, its use (not yet recorded) still ahead."""
        self._reap_writes()
        while True:
            buffer = self.source.try_acquire(nbytes)
            if buffer is not None:
                return buffer, self.source.keeps(buffer)
            victim = self._choose_victim(nbytes, incoming, use_pending)
            if victim is not None:
                self.counters.evictions += 1
                if victim.state == S.CLEAN:
                    self._drop(victim, S.ON_FILE)
                else:
                    self._start_write(victim, evicting=True)
                    self.counters.waits_for_slots += 1
                    self._wait_write(victim)
                continue
            pending = next((entry for entry in self._writing.values()
                            if entry.evicting and self.source.frees_room_for(entry.buffer, nbytes)), None)
            if pending is not None:
                self.counters.waits_for_slots += 1
                self._wait_write(pending)
                continue
            self.counters.transient_buffers += 1
            return self.source.fallback(nbytes), False

    def _choose_victim(self, nbytes: int, incoming, use_pending: bool = False) -> Optional[Entry]:
        fitting = [entry.key for entry in self._cached.values() if self.source.frees_room_for(entry.buffer, nbytes)]
        if not fitting:
            return None
        position = self.recorder.position
        index = self.next_use if self.recorder.on_track else None  # a step that left the profile: LRU
        key = choose_victim(fitting, index, position)
        if self.source.bypass and index is not None and incoming in index and \
                bypasses(index, key, incoming, position, use_pending):
            self.counters.bypassed += 1
            return None
        return self._entries[key]


def _wait_quietly(future: Future) -> None:
    try:
        future.result()
    except BaseException:  # the caller reads future.exception() and decides
        pass


def _done(target: torch.Tensor) -> Future:
    future = Future()
    future.set_result(None)
    future.target = target
    return future
