"""One host tier of swapped tensors: their files and the host buffers that hold their bytes. Owns: the store's
calls (registering, lending, releasing, forgetting, stats) and its lock; each call moves entries through the state
machine of cache/entry.py. Its parts: the entries and their indexes (cache/entry_table.py), reads and writes
between buffer and file (cache/transfers.py), which entries hold buffers and which gives one up (cache/admission.py,
by plan/eviction.py's Belady over the profiled order, least recently used before the order is known), storing and
flushing (cache/write_back.py). Does not own: where buffers come from (a ``BufferSource``: arena slots for parameter
partitions, budgeted pageable memory for optimizer state: cache/buffer_sources.py) or when tensors are needed
(DeepSpeed, through integrations/deepspeed).

Zero-copy: a swap-in of a held entry lends its buffer itself (no memcpy); the borrower hands it back with
``release(key, changed=...)``. Write-back: changed bytes reach the file only when the entry is evicted, flushed
(checkpoint, close) or cannot be kept (no room); reads of an entry being written wait for that write alone.

Plain class: torch, not DeepSpeed, so it is tested on its own (tests/cache/test_entry_store.py).

Locking: one lock guards every entry; it is not held while waiting for I/O (one exception: a prefix written at a
flush, given up, or given way when the tensor can be kept whole: cache/transfers.py ``write_prefix``). A wait
releases it, and the state is looked at again afterwards (another thread may have moved the entry meanwhile).
"""
import contextlib
import dataclasses
import os
import threading
from concurrent.futures import Future
from typing import Callable, Dict, Hashable, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from ..io.direct_io import DirectFileIO
from ..log import logger
from ..memory.device_staging import StagedDeviceCopy
from ..profile.next_use import NextUseIndex
from ..profile.recorder import StepRecorder
from .admission import Admission, ExclusiveStore
from .buffer_sources import BufferSource
from .entry import CACHED, LENT, Entry, EntryState, PendingUse, lent_state, released
from .entry_table import EntryTable
from .store_counters import StoreCounters
from .transfers import PostponedInterrupt, Transfers
from .write_back import WriteBack

S = EntryState
DEBUG_CHECKS_ENV = "TENCACHE_DEBUG_CHECKS"  # "1": check_invariants() after every public call (tests turn it on)


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
                 source: BufferSource, device_copy: Optional[StagedDeviceCopy] = None):
        self.name = name
        self.dtype = dtype
        self.source = source
        self.recorder = StepRecorder()
        self.counters = StoreCounters()
        self.debug_checks = os.environ.get(DEBUG_CHECKS_ENV) == "1"
        # reentrant only so that its owner is known (Transfers takes it back after a wait through interrupts); no
        # call takes it twice: a wait releases it once
        self._lock = threading.RLock()
        self._table = EntryTable()
        self._transfers = Transfers(name, dtype, aligned_numel, io, source, self._table, self._lock, self.recorder,
                                    self.counters)
        self.element_size = self._transfers.element_size
        self._admission = Admission(self._table, self._transfers, source, self.recorder, self.counters)
        # how parts on a device reach host buffers; its staging chunks are made at the first such part
        self.device_copy = device_copy or StagedDeviceCopy.for_store(f"{name}-staging")
        self._write_back = WriteBack(self._transfers, self._admission, self._checked, self.lend_new, self.release,
                                     self.device_copy)
        self._copy_of = None  # key -> the fill of a copy newer than its file, or None (read_from_copies)

    @property
    def next_use(self) -> Optional[NextUseIndex]:
        """The profiled order eviction follows (None: least recently used)."""
        return self._admission.next_use

    @next_use.setter
    def next_use(self, index: Optional[NextUseIndex]) -> None:
        self._admission.next_use = index

    # --------------------------------------------------------------------------------------------- registry
    def add(self, key, numel: int, path: str) -> None:
        """Register ``key`` whose bytes are already on file at ``path`` (no-op if known)."""
        with self._lock:
            if key not in self._table:
                self._table.new(key, numel, path, S.ON_FILE)

    def knows(self, key) -> bool:
        with self._lock:
            return key in self._table

    def state(self, key) -> Optional[EntryState]:
        with self._lock:
            entry = self._table.get(key)
            return None if entry is None else entry.state

    def kept(self, key) -> bool:
        """Does ``key``'s buffer stay in host memory after use (False: transient, or no buffer)?"""
        with self._lock:
            entry = self._table.get(key)
            return entry is not None and entry.buffer is not None and entry.kept

    def path(self, key) -> str:
        with self._lock:
            return self._table[key].path

    def numels(self) -> List[tuple]:
        """(key, numel) of every entry, sorted: what a profile of this store is recorded for."""
        with self._lock:
            return sorted(((entry.key, entry.numel) for entry in self._table), key=repr)

    def lent_or_reading(self) -> int:
        """Entries lent out or being read (a counter, not a scan: the coordinator asks on every module fetch)."""
        with self._lock:
            return self._table.count(S.LENT_CLEAN, S.LENT_DIRTY, S.READING)

    def lendable_without_buffer(self) -> int:
        """Entries held between uses, which a swap-in lends without a buffer, while every entry the profiled step
        uses is held (entries on file, or being written there, are ones the step never uses: a tied weight's own
        partition, say). Then asking for the step's entries needs no read. 0 without a profile, or while the tier
        holds only part of the step. The coordinator asks on every module fetch: the entries on file are an index
        (the first one the step uses ends the look), the held ones a count."""
        with self._lock:
            index = self._admission.next_use
            if index is None or any(key in index for key in self._table.away_keys()):
                return 0
            return self._table.count(S.CLEAN, S.DIRTY)

    def swap_nbytes(self, numel: int) -> int:
        return self._transfers.swap_nbytes(numel)

    # ------------------------------------------------------------------------------------------ lending
    def lend_new(self, key, numel: int, path: str, staging: bool = False, transient: bool = False) -> torch.Tensor:
        """A buffer for ``key``'s new bytes, whole (the old ones, if any, are not read): the caller fills it and
        releases it with ``changed=True``. ``staging``: a one-time pageable buffer (zero.Init's first write of each
        partition, before any size is planned). ``transient``: a buffer that takes no held entry's room and is not
        kept (bytes the caller will ``discard``). Returns a view of exactly ``numel`` elements."""
        transfers = self._transfers
        with self._lock:
            entry = self._table.get(key)
            if entry is not None and (entry.numel, entry.path) != (numel, path):
                self._forget_locked(entry)  # a new tensor under an old key (a rebuilt model): the old bytes go
                entry = None
            created = entry is None
            if created:
                entry = self._table.new(key, numel, path, S.ON_FILE)
            transfers.wait_write(entry)
            # a read into the caller's buffer too: the new bytes would be lent while it reads the file, which a
            # release not kept then overwrites under it (the invariants forbid both at once: cache/entry.py)
            if entry.state in LENT or entry.state == S.READING or entry.external_read is not None:
                raise RuntimeError(f"{self.name}: tensor {key} is already lent or being read")
            if entry.state == S.ON_FILE:
                try:
                    if staging:
                        transfers.attach(entry, transfers.staging.acquire_pageable(self.swap_nbytes(numel), False),
                                         False)
                        entry.staged = True
                    elif transient:
                        transfers.attach(entry, *self._admission.acquire_transient(self.swap_nbytes(numel)))
                    else:
                        transfers.attach(entry, *self._admission.acquire(self.swap_nbytes(numel), key))
                except BaseException:  # (a victim's write failed, Ctrl-C) a tensor made here has no bytes anywhere:
                    if created:        # it goes, where it stayed known on file, its file never written (a later
                        self._forget_locked(entry)  # lend read a missing file, or a stale one: helper-174's test)
                    raise
                # the new bytes replace the whole tensor: its prefix is dead (not before the buffer is secured: an
                # acquire that raised would have left the file's older first bytes the newest)
                transfers.drop_prefix(entry)
            else:
                transfers.fence(entry.buffer)
            self._table.set(entry, S.LENT_DIRTY)
            view = transfers.compute_view(entry)
            self._checked()
            return view

    def read_from_copies(self, copy_of: Callable[[Hashable], Optional[Callable]]) -> None:
        """Have every read of an entry on file ask ``copy_of(key)`` first: a fill (as ``lend_copied`` takes) where its
        file is behind a copy of its bytes kept elsewhere, which the read then takes instead of the file, at a use or
        ahead of one (the optimizer's fp32 masters owed to their files: integrations/deepspeed/
        master_write_behind.py); None where the file is current."""
        self._copy_of = copy_of

    def _start_file_read(self, entry: Entry, access: Optional[int], fill=None,
                         into: Optional[torch.Tensor] = None) -> bool:
        """Read ``entry`` into its attached buffer (or the caller's ``into``): from its file (a miss: returns True),
        or from a copy: ``fill`` (``lend_copied``'s), else the one ``read_from_copies`` names, counted as ``copied``.
        ``access``: the use it serves, recorded already; None for a read ahead, whose use is recorded when it comes
        (``wait_read``)."""
        if fill is None and self._copy_of is not None:
            try:
                fill = self._copy_of(entry.key)
            except BaseException:  # (Ctrl-C in its lock, a bug) the buffer just attached goes back: the entry is on
                if into is None:   # file without one, not holding a reservation for good (helper-171)
                    self._transfers.release_buffer(entry)
                raise
        if fill is not None:
            if into is None:
                copied = self._transfers.start_copied_read(entry, fill)
            else:
                copied = self._transfers.start_copied_external_read(entry, into, fill)
            if copied:
                self.counters.copied += 1
                self.counters.copied_bytes += self.swap_nbytes(entry.numel)
                if access is None:
                    entry.pending_use = PendingUse()  # not timed: the copy's own reads
                return False
        if into is None:
            self._transfers.start_read(entry, access)
        else:
            self._transfers.start_external_read(entry, into, access)
        return True

    def start_read(self, key, into: Optional[torch.Tensor] = None, prefetch: bool = False) -> None:
        """Begin lending ``key``: a held entry is a hit (no I/O); otherwise its file is read into a buffer of ours,
        or into the caller's ``into`` (aligned length; the entry then stays on file). ``wait_read`` finishes.
        ``prefetch``: the use is still ahead (counted as a prefetch, and as late if wait_read has to wait)."""
        with self._lock:
            entry = self._table[key]
            self._transfers.wait_write(entry)
            if entry.state in LENT or entry.state == S.READING or entry.external_read is not None:
                raise RuntimeError(f"{self.name}: tensor {key} is already lent or being read")
            # The profile records uses: a prefetch is recorded when wait_read hands it over (its pending use), so
            # reading ahead never changes the recorded order.
            access = None if prefetch else self.recorder.touch(key, self.swap_nbytes(entry.numel))
            if entry.state in CACHED:
                self.counters.hits += 1
                if into is not None:  # the caller wants its own copy; ours stays cached
                    self._transfers.copy_into(entry, into)
                else:
                    self._table.set(entry, lent_state(entry.state))
                if prefetch:
                    entry.pending_use = PendingUse()  # no read to time
                self._checked()
                return
            if into is None:
                buffer, kept = self._admission.acquire(self.swap_nbytes(entry.numel), key, use_pending=prefetch)
                self._transfers.attach(entry, buffer, kept)
            missed = self._start_file_read(entry, access, into=into)
            # counted once the read is in flight (one the engine refuses is no miss served)
            self.counters.misses += missed
            self.counters.prefetch_issued += prefetch
            entry.prefetched = prefetch  # once the read is in flight (the entry's invariants hold at every wait)
            if into is None:
                self._checked()

    def prefetch_if_free(self, key, idle_slot: bool = False, room: bool = True, make_room: bool = False) -> bool:
        """Start reading ``key`` ahead of its use if it is on file and a buffer is free right now: never waits for
        I/O, never evicts what is needed sooner (a prefetch must not stall the caller or push out what is needed
        first). False if not started. ``idle_slot``: with no room to keep it, a transient buffer the source holds
        idle will do (a streaming slot nothing uses now; never new memory). ``room`` False: only such a slot, and
        nothing where the budget has room for it (that room is another use's, made before this one: the swap-in in
        progress when the optimizer reads the next sub-group early). ``make_room``: with no buffer free, the held
        entry needed farthest after ``key`` gives its buffer up (``Admission.victim_for_read_ahead``): at once
        where it is unchanged; where it changed, its write starts (not waited for) and this read is for a later
        call (or its use, which finds the buffer free once that write is done, and otherwise evicts as any use
        does). Not while a write that frees a buffer of the class is in flight: one at a time, not a victim per
        retry; nor where the victim's last write failed (a failing drive: its use's own eviction retries it and
        raises there, rather than every access writing it again). The use that follows is ``wait_read`` (the profile
        records it then)."""
        with self._lock:
            self._transfers.reap_writes()  # first: a write done since leaves its tensor on file, readable
            entry = self._table.get(key)
            if entry is None or entry.state != S.ON_FILE or entry.external_read is not None:
                return False
            nbytes = self.swap_nbytes(entry.numel)
            if not room and self.source.room_needed(nbytes) == 0:
                return False
            buffer = self.source.try_acquire(nbytes) if room else None
            if buffer is None and room and make_room and not self._admission.eviction_in_flight(nbytes):
                victim = self._admission.victim_for_read_ahead(nbytes, key)
                if victim is not None and victim.write_failed:
                    return False
                if victim is not None and victim.state == S.DIRTY:
                    try:
                        self._transfers.start_write(victim, evicting=True)  # its buffer goes when it is done
                    except Exception as err:  # noqa: BLE001  refused: the victim stays DIRTY (write_errors), and
                        # the eviction its use makes writes it again and raises there
                        logger.warning("%s: the write of %s for a read ahead was refused (%s); it is retried when "
                                       "that partition is evicted or flushed", self.name, victim.path, err)
                        return False
                    # counted as started (a write that fails later leaves the victim held, DIRTY)
                    self.counters.evictions += 1
                    self.counters.prefetch_write_backs += 1
                    self._checked()
                    return False
                if victim is not None:
                    self._transfers.drop(victim, S.ON_FILE)
                    self.counters.evictions += 1
                    self.counters.prefetch_evictions += 1
                    buffer = self.source.try_acquire(nbytes)
            if buffer is None and idle_slot:
                buffer = self.source.try_acquire_idle(nbytes)
            if buffer is None:
                return False
            self._transfers.attach(entry, buffer, self.source.keeps(buffer))
            self.counters.misses += self._start_file_read(entry, None)
            self.counters.prefetch_issued += 1
            entry.prefetched = True
            self._checked()
            return True

    def read_done(self, key) -> bool:
        """True unless a read of ``key`` is still in flight."""
        with self._lock:
            future = self._transfers.read_of(self._table.get(key))
            return future is None or future.done()

    def wait_read(self, key) -> torch.Tensor:
        """Finish lending ``key``; returns the lent view of exactly ``numel`` elements. A failed read raises its
        error and leaves the entry on file (partial bytes are never served)."""
        with self._lock:
            entry = self._table[key]
            try:
                if entry.prefetched:
                    entry.prefetched = False
                    in_flight = self._transfers.read_of(entry)
                    self.counters.prefetch_late += in_flight is not None and not in_flight.done()
                external, entry.external_read = entry.external_read, None
                if external is not None:
                    error = self._transfers.wait_unlocked(external)
                    if error is not None:
                        raise error
                    return external.target.narrow(0, 0, entry.numel)
                if entry.state == S.READING:
                    postponed = PostponedInterrupt(self._transfers)
                    postponed.wait(entry.io)
                    postponed.finish_io(entry)  # raises the read's error, entry back ON_FILE
                    if postponed.error is not None:  # the caller never gets the view: the lend goes back, unused
                        entry.prefetched, entry.pending_use = False, None
                        self._release_lent(entry, changed=False, fence=None, copy_elsewhere=False)
                        postponed.raise_if_any()
                if entry.state not in LENT:
                    raise RuntimeError(f"{self.name}: tensor {key} has no read in flight ({entry.state.value})")
                view = self._transfers.compute_view(entry)
                self._checked()
                return view
            finally:
                self._transfers.record_pending_use(self._table.get(key))

    def lend(self, key) -> torch.Tensor:
        self.start_read(key)
        try:
            return self.wait_read(key)
        except BaseException:  # (Ctrl-C before the wait began) the caller never gets the view: the lend goes back
            self.release(key)
            raise

    def lend_copied(self, key, fill: Callable[[torch.Tensor], Optional[Sequence[Future]]]) -> torch.Tensor:
        """Lend ``key`` as ``lend`` does, but where it is on file, have ``fill(view)`` put its bytes into the
        buffer from another copy of what its file holds (the optimizer's fp32 master from the parameter partitions
        it was last copied into: integrations/deepspeed/master_copies.py) instead of reading the file: copied at
        once, or read from the copy's own files (the reads ``fill`` returns, waited for as a read of this file
        would be). ``fill`` returns None where it finds no such copy: the file is read then. The use is recorded as
        any lend's."""
        with self._lock:
            entry = self._table[key]
            self._transfers.wait_write(entry)
            copyable = self._copyable(entry)
            if copyable:
                nbytes = self.swap_nbytes(entry.numel)
                access = self.recorder.touch(key, nbytes)
                self._transfers.attach(entry, *self._admission.acquire(nbytes, key))
                self.counters.misses += self._start_file_read(entry, access, fill=fill)
                self._checked()
        if not copyable:
            return self.lend(key)
        try:
            return self.wait_read(key)
        except BaseException:  # (Ctrl-C before the wait began) the caller never gets the view: the lend goes back,
            self.release(key)  # as ``lend``'s (helper-171: left READING, every later lend of it refused)
            raise

    def copyable(self, key) -> bool:
        """Would ``lend_copied`` take ``key``'s bytes from a copy (the entry on file, or being written there, with no
        prefix and no read in flight)? False for an unknown key."""
        with self._lock:
            entry = self._table.get(key)
            return entry is not None and (self._copyable(entry) or (entry.state == S.WRITING and entry.evicting
                                                                     and entry.prefix is None))

    @staticmethod
    def _copyable(entry: Entry) -> bool:
        return entry.state == S.ON_FILE and entry.external_read is None and entry.prefix is None

    def newest_view(self, key) -> Optional[torch.Tensor]:
        """A view (``numel`` elements) of the buffer of ours that holds ``key``'s newest bytes (held, lent or being
        written), without lending, reading or recording a use; None where only its file has them (or a read into our
        buffer is still in flight). It shows those bytes only until the entry is evicted or written into: the caller
        keeps both from happening while it reads (integrations/deepspeed/master_write_behind.py)."""
        with self._lock:
            return self._held_view(self._table.get(key))

    def _held_view(self, entry: Optional[Entry]) -> Optional[torch.Tensor]:
        """The view of a buffer of ours holding ``entry``'s newest bytes, or None (on file, or a read into our buffer
        still in flight)."""
        if entry is None or entry.buffer is None or entry.state == S.READING:
            return None
        return self._transfers.compute_view(entry)

    def read_newest_into(self, key, dest: torch.Tensor) -> Optional[Future]:
        """Fill ``dest`` (exactly ``numel`` elements, at any address: its neighbours in a larger tensor are not
        touched) with ``key``'s newest bytes without lending, taking a buffer or recording a use: copied now where a
        buffer of ours holds them (held, lent or being written; returns None), else read from its file (returns that
        read, for the caller to wait for: the file keeps those bytes until the entry's next write, which only new
        bytes lent or stored bring). The fp32 master filled from parameter partitions on file
        (integrations/deepspeed/master_copies.py)."""
        with self._lock:
            entry = self._table[key]
            held = self._held_view(entry)
            if held is not None:
                dest.copy_(held)
                return None
            return self._transfers.read_exactly(entry, dest)

    def read_into(self, key, dest: torch.Tensor) -> None:
        """Copy ``key``'s newest bytes into ``dest`` (``numel`` elements of any CPU tensor) without lending."""
        self.start_read(key)
        try:
            dest.copy_(self.wait_read(key))
        finally:  # (Ctrl-C in the copy) lent for the copy only
            self.release(key)

    def release(self, key, changed: bool = False, fence=None, copy_elsewhere: bool = False) -> None:
        """The borrower is done with ``key`` (``changed``: it wrote to the bytes). The entry stays held if its
        buffer may be kept, else its bytes go to the file first when they are owed. Idempotent; a read still in
        flight is finished first. ``fence`` (a CUDA event) marks the end of device copies reading the bytes.
        ``copy_elsewhere``: the borrower keeps a current copy of the bytes elsewhere, which its next use is served
        from (``lend_copied``): the buffer gives its room up before others (cache/admission.py), and a prefix goes
        (the write below then writes the whole tensor) for room that saves reads."""
        with self._lock:
            entry = self._table.get(key)
            if entry is None:
                return
            # released unused: neither used nor late, nor recorded
            entry.prefetched, entry.pending_use = False, None
            postponed = PostponedInterrupt(self._transfers)  # interrupted, the release is still made
            external, entry.external_read = entry.external_read, None
            if external is not None:
                postponed.wait(external)
            if entry.state == S.READING:
                postponed.wait(entry.io)
                postponed.finish_io(entry)
            self._release_lent(entry, changed, fence, copy_elsewhere)
            postponed.raise_if_any()

    def _release_lent(self, entry: Entry, changed: bool, fence, copy_elsewhere: bool) -> None:
        """``release`` once no read of ``entry`` is in flight; nothing for an entry not lent."""
        if entry.state not in LENT:
            return
        if changed and entry.state == S.LENT_CLEAN:
            self._table.set(entry, S.LENT_DIRTY)
        entry.copy_elsewhere = copy_elsewhere
        if fence is not None:
            entry.buffer.fence = fence
        if entry.kept and not self._transfers.keeps(entry):
            entry.kept = False  # held only for a failed write's bytes: the write is retried now, then it goes
        if entry.kept:
            self._table.set(entry, released(entry.state))
        elif entry.state == S.LENT_CLEAN:
            self._transfers.drop(entry, S.ON_FILE)
        else:  # no room to keep it: to the file (past a prefix, if spare room holds one), then it goes
            if entry.copy_elsewhere:  # the lent buffer holds every byte: the prefix's are written with the rest
                self._transfers.drop_prefix(entry)
            self._admission.grant_prefix(entry)
            self._transfers.start_write(entry, evicting=True)
        self._checked()

    def release_rewritten_elsewhere(self, key) -> bool:
        """The borrower gives ``key`` back changed and writes its file itself, from a copy of the new bytes it keeps
        elsewhere (integrations/deepspeed/master_write_behind.py: an fp32 master, from the parameter partitions): a
        buffer the store would not keep goes, unwritten, and so does a prefix (the file's first bytes change). Only
        from LENT_CLEAN (the store owes the file nothing else) and a buffer not kept (a kept one is written back
        only when evicted: the caller releases it as changed); False, and nothing done, otherwise."""
        with self._lock:
            entry = self._table.get(key)
            if entry is None or entry.state != S.LENT_CLEAN or entry.kept or entry.external_read is not None:
                return False
            entry.prefetched, entry.pending_use = False, None
            entry.copy_elsewhere = True
            self._transfers.drop_prefix(entry)
            self._transfers.drop(entry, S.ON_FILE)
            self._checked()
            return True

    def mark_changed(self, key) -> None:
        """The borrower changed ``key``'s lent bytes (they are now the newest)."""
        with self._lock:
            entry = self._table[key]
            if entry.state == S.LENT_CLEAN:
                self._table.set(entry, S.LENT_DIRTY)

    def mark_all_lent_changed(self) -> None:
        """Every lent entry may have been changed in place by its borrower (stage 3 copies new weights into
        partitions it holds at the optimizer step without calling us): treat their bytes as the newest."""
        with self._lock:
            for entry in self._table:
                if entry.state == S.LENT_CLEAN:
                    self._table.set(entry, S.LENT_DIRTY)

    # -------------------------------------------------------------------- writing (cache/write_back.py)
    def store(self, key, source: torch.Tensor) -> None:
        self._write_back.store(key, source)

    def write_parts(self, key, numel: int, path: str, parts: Sequence[Tuple[int, torch.Tensor]]) -> None:
        self._write_back.write_parts(key, numel, path, parts)

    def write_and_release(self, keys: Iterable) -> None:
        self._write_back.write_and_release(keys)

    def flush(self, skip: Optional[Callable[[Hashable], bool]] = None, lent_stay: bool = False) -> int:
        return self._write_back.flush(skip, lent_stay)

    def flush_key(self, key) -> None:
        self._write_back.flush_key(key)

    def wait_writes(self) -> None:
        self._write_back.wait_writes()

    def reap_writes(self) -> None:
        """Apply the outcome of the writes that finished on their own: their entries are on file (or cached) from
        now on, and transient buffers free. Never waits. A write is otherwise reaped only when something needs its
        entry or a buffer, so until then ``state`` reads WRITING for a write long done."""
        with self._lock:
            self._transfers.reap_writes()
            self._checked()

    # ------------------------------------------------------------------------------------ giving memory back
    def kept_bytes(self) -> int:
        """Bytes of buffers the tier keeps between uses (held now, or lent and to be held again at release)."""
        with self._lock:
            return self._admission.kept_bytes()

    def trim_kept(self, target_bytes: int) -> int:
        """Keep at most ``target_bytes`` of buffers from now on (memory pressure): held entries go, the one needed
        farthest ahead first (least recently used before the order is known), dirty ones written first; if that is
        not enough, lent entries are no longer kept and go when released. Returns the kept bytes left."""
        with self._lock:
            kept = self._admission.trim_kept(target_bytes)
            self._checked()
            return kept

    @contextlib.contextmanager
    def exclusive(self) -> Iterator["ExclusiveStore"]:
        """The store's lock held across several steps of a caller that keeps books of the same buffers (the
        parameter store retiring arena slots: a slot freed for retiring must not be taken meanwhile). Yields the
        calls that are safe inside; the invariants are checked at the end."""
        with self._lock:
            yield ExclusiveStore(self._table, self._transfers, self._admission)
            self._checked()

    def forget(self, key) -> None:
        """Drop ``key``'s entry without writing (its file was replaced by someone else); unknown keys are ignored."""
        with self._lock:
            entry = self._table.get(key)
            if entry is not None:
                self._forget_locked(entry)
                self._checked()

    def discard(self, key) -> None:
        """The borrower is done with lent ``key`` and its bytes are dead (a gradient the update has consumed, whose
        source is not ours): the buffer goes back unwritten and the entry is forgotten. Unknown keys are ignored."""
        with self._lock:
            entry = self._table.get(key)
            if entry is None:
                return
            if entry.state not in LENT:
                raise RuntimeError(f"{self.name}: cannot discard tensor {key}: it is not lent ({entry.state.name})")
            self._transfers.forget(entry)
            self._checked()

    def held_keys(self) -> List[Hashable]:
        """Keys not lent whose bytes are in host memory, whole (clean or dirty copies) or a prefix: what a
        checkpoint load must forget."""
        with self._lock:
            return [entry.key for entry in self._table
                    if entry.state in CACHED or (entry.prefix is not None and entry.state not in LENT)]

    def forget_all(self) -> None:
        """Drop every entry without writing (the files were replaced, e.g. by a checkpoint load)."""
        with self._lock:
            for entry in list(self._table):
                self._forget_locked(entry)
            self._checked()

    def busy_slots(self) -> Dict[int, int]:
        """Arena slots no eviction can free now, by slot bytes: those of tensors lent (persistent parameters stay
        lent for the whole run) or with I/O in flight."""
        counts: Dict[int, int] = {}
        with self._lock:
            for entry in self._table:
                buffer = entry.buffer
                if buffer is not None and buffer.slot is not None and \
                        (entry.state in LENT or entry.state in (S.READING, S.WRITING)):
                    counts[buffer.capacity_bytes] = counts.get(buffer.capacity_bytes, 0) + 1
        return counts

    # ------------------------------------------------------------------------------------ checks and stats
    def check_invariants(self) -> None:
        """Raise AssertionError if any invariant of the store is broken (tests run it after every call)."""
        with self._lock:
            self._check_invariants_locked()

    def _check_invariants_locked(self) -> None:
        self._table.check(lambda entry: self.swap_nbytes(entry.numel))
        self.source.check()

    def stats(self) -> Dict[str, int]:
        with self._lock:
            held = self._table.held()
            counters = dataclasses.asdict(self.counters)
            return {**counters, "num_tensors": len(self._table), "cached_tensors": len(held),
                    "cached_bytes": sum(entry.buffer.capacity_bytes for entry in held),
                    "kept_bytes": self._admission.kept_bytes(),  # held or lent from a buffer the tier keeps
                    "dirty_tensors": self._table.count(S.DIRTY, S.LENT_DIRTY),
                    "prefix_tensors": sum(entry.prefix is not None for entry in self._table),
                    "prefix_bytes": sum(entry.prefix_nbytes for entry in self._table),
                    "resident_tensors": self._table.count(S.LENT_CLEAN, S.LENT_DIRTY), **self.device_copy.stats()}

    def close(self) -> None:
        """Wait for I/O in flight and give every buffer back (dirty bytes are not written: flush first)."""
        self.forget_all()
        self._transfers.close()
        self.device_copy.close()

    # ---------------------------------------------------------------------------------------------- private
    def _checked(self) -> None:
        if self.debug_checks:
            self._check_invariants_locked()

    def _forget_locked(self, entry: Entry) -> None:
        if entry.state in LENT:
            raise RuntimeError(f"{self.name}: cannot forget tensor {entry.key}: it is lent")
        self._transfers.forget(entry)
