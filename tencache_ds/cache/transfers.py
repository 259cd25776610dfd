"""Moving one entry's bytes between its buffer and its file. Owns: starting reads and writes, applying their outcomes
to the entry (a failed read leaves it on file, a failed write leaves it dirty), waiting for them with the store's
lock released, attaching and dropping buffers, and timing reads into the step recorder. Does not own: which entry
gets a buffer or gives one up (cache/admission.py), or when a tensor is used (cache/entry_store.py).

An entry's prefix (cache/entry.py) is part of its bytes: reads copy it in and read the rest of the file at its
offset, an eviction's write copies it out and writes the rest (the whole tensor when the file is shared with a
checkpoint, where a partial write would first copy the file: io/shared_files.py).

Locking: every method is called with the store's lock held; ``wait_unlocked`` releases it while it waits, so the
caller looks at the entry's state again afterwards.
"""
import concurrent.futures
import threading
from concurrent.futures import Future
from typing import Callable, Optional, Sequence, Tuple

import torch

from ..io.direct_io import DirectFileIO
from ..io.shared_files import is_shared
from ..log import logger
from ..memory.pool import BufferPool, HostBuffer
from ..profile.recorder import StepRecorder
from .buffer_sources import BufferSource
from .entry import IO_IN_FLIGHT, Entry, EntryState, PendingUse
from .entry_table import EntryTable

S = EntryState


class Transfers:
    """Reads and writes of the entries of one store (``table``), through ``io``, into buffers from ``source`` (or
    the staging pool: first bytes of new tensors, before any plan)."""

    def __init__(self, name: str, dtype: torch.dtype, aligned_numel: Callable[[int], int], io: DirectFileIO,
                 source: BufferSource, table: EntryTable, lock, recorder: StepRecorder, counters):
        self.name = name
        self.dtype = dtype
        self.element_size = torch.empty((), dtype=dtype).element_size()
        self._aligned_numel = aligned_numel
        self.io = io
        self.source = source
        self.staging = BufferPool(f"{name}-staging", lock="off")
        self.table = table
        self.lock = lock  # the store's: released while waiting
        self.recorder = recorder
        self.counters = counters

    def swap_nbytes(self, numel: int) -> int:
        return self._aligned_numel(numel) * self.element_size

    def swap_view(self, entry: Entry) -> torch.Tensor:
        return entry.buffer.view(self.dtype, self._aligned_numel(entry.numel))

    def compute_view(self, entry: Entry) -> torch.Tensor:
        return entry.buffer.view(self.dtype, entry.numel)

    # ----------------------------------------------------------------------------------------------- buffers
    @staticmethod
    def attach(entry: Entry, buffer: HostBuffer, kept: bool) -> None:
        entry.buffer, entry.kept = buffer, kept

    def release_buffer(self, entry: Entry) -> None:
        buffer, staged = entry.buffer, entry.staged
        entry.buffer, entry.kept, entry.staged = None, False, False
        (self.staging if staged else self.source).release(buffer)

    def drop(self, entry: Entry, new: EntryState) -> None:
        self.release_buffer(entry)
        entry.io, entry.evicting = None, False
        self.table.set(entry, new)

    def forget(self, entry: Entry) -> None:
        """Take ``entry`` out of the table without writing: its I/O in flight is waited for (a read into the
        caller's buffer must not outlive the entry either), its buffer goes back."""
        postponed = PostponedInterrupt(self)  # interrupted, it is forgotten all the same, then the interrupt raised
        if entry.state in IO_IN_FLIGHT:
            postponed.wait(entry.io)
        if entry.external_read is not None:
            postponed.wait(entry.external_read)
        entry.prefetched, entry.pending_use, entry.external_read = False, None, None
        if entry.buffer is not None:
            self.release_buffer(entry)
        self.drop_prefix(entry)
        self.table.remove(entry)
        postponed.raise_if_any()

    @staticmethod
    def fence(buffer: HostBuffer) -> None:
        if buffer.fence is not None:  # a device copy may still be reading the old bytes
            buffer.fence.synchronize()
            buffer.fence = None

    # --------------------------------------------------------------------------------------------- reads
    def start_read(self, entry: Entry, access: Optional[int]) -> None:
        """Read ``entry``'s file into its attached buffer (``access``: the recorded use it serves; None for a read
        ahead, whose use is recorded later)."""
        timer = self._read_timer(entry, access)  # after the buffer was found: those waits are stalls, not read time
        try:
            entry.io = self._read_past_prefix(entry, self.swap_view(entry), self._aligned_numel(entry.numel))
        except BaseException:  # refused before it started (an engine closed): the entry is on file, bufferless
            entry.pending_use = None
            self.release_buffer(entry)
            raise
        entry.io.add_done_callback(timer)
        self.table.set(entry, S.READING)

    def start_copied_read(self, entry: Entry, fill: Callable[[torch.Tensor], Optional[Sequence[Future]]]) -> bool:
        """A read of ``entry`` into its attached buffer served by ``fill``, which fills it with the bytes its file
        holds from another copy of them: copied at once, or read from other files (the reads ``fill`` returns;
        READING until they are done, then lent by the wait as a file read is). False, and nothing started, where
        ``fill`` finds no such copy (None)."""
        try:
            reads = fill(self.compute_view(entry))
        except BaseException:  # the entry is on file again, without the buffer it was given
            self.release_buffer(entry)
            raise
        if reads is None:
            return False
        tail = self.swap_view(entry).narrow(0, entry.numel, self._aligned_numel(entry.numel) - entry.numel)
        tail.zero_()  # past the tensor, up to the I/O alignment: written back with it, so never another's bytes
        entry.io = all_done(reads)  # not timed for the profile: the copy's own reads
        self.table.set(entry, S.READING)
        return True

    def start_external_read(self, entry: Entry, into: torch.Tensor, access: Optional[int]) -> None:
        """Read ``entry``'s file into the caller's ``into``; the entry stays as it is."""
        timer = self._read_timer(entry, access)
        try:
            entry.external_read = self._read_past_prefix(entry, into, self._aligned_numel(entry.numel))
        except BaseException:  # refused before it started: no read, so no use pending for one
            entry.pending_use = None
            raise
        entry.external_read.target = into
        entry.external_read.add_done_callback(timer)

    def start_copied_external_read(self, entry: Entry, into: torch.Tensor,
                                   fill: Callable[[torch.Tensor], Optional[Sequence[Future]]]) -> bool:
        """``start_copied_read`` into the caller's ``into`` (its first ``numel`` elements); the entry stays as it
        is. False, and nothing started, where ``fill`` finds no copy."""
        if into.dtype != self.dtype:  # (as a read of the file refuses it: _read_past_prefix)
            raise ValueError(f"{entry.key}: its {self.dtype} elements cannot be read into {into.dtype} ones")
        reads = fill(into.narrow(0, 0, entry.numel))
        if reads is None:
            return False
        entry.external_read = all_done(reads)
        entry.external_read.target = into
        return True

    def _read_past_prefix(self, entry: Entry, target: torch.Tensor, numel: int) -> Future:
        """Fill ``target``'s first ``numel`` elements (the tensor's, or its aligned length) with ``entry``'s bytes:
        those its prefix holds copied now, the rest read from its file at the prefix's offset."""
        if target.dtype != self.dtype:  # (the file's bytes would land as other values)
            raise ValueError(f"{entry.key}: its {self.dtype} elements cannot be read into {target.dtype} ones")
        skip = min(self._prefix_elements(entry), numel)
        if skip:
            target.narrow(0, 0, skip).copy_(self._prefix_view(entry).narrow(0, 0, skip))
            self.counters.prefix_read_bytes_saved += skip * self.element_size
        rest = target.narrow(0, skip, numel - skip)
        if not rest.numel():
            done = Future()
            done.set_result(None)
            return done
        return self.io.read(rest, entry.path, file_offset=skip * self.element_size)

    def read_exactly(self, entry: Entry, dest: torch.Tensor) -> Future:
        """Read ``entry``'s ``numel`` elements into ``dest`` and nothing past them (not its aligned length: ``dest``
        may be a slice of a larger tensor): its prefix copied now, the rest read from its file at the prefix's
        offset. The entry stays as it is."""
        if dest.dtype != self.dtype or dest.numel() != entry.numel:  # (the file's bytes would land as other values)
            raise ValueError(f"{entry.key}: its {entry.numel} {self.dtype} elements cannot be read into "
                             f"{dest.numel()} {dest.dtype} elements")
        return self._read_past_prefix(entry, dest, entry.numel)

    # ------------------------------------------------------------------------------------------ prefixes
    def _prefix_elements(self, entry: Entry) -> int:
        return entry.prefix_nbytes // self.element_size

    def _prefix_view(self, entry: Entry) -> torch.Tensor:
        return entry.prefix.view(self.dtype, self._prefix_elements(entry))

    def attach_prefix(self, entry: Entry, buffer: HostBuffer, nbytes: int) -> None:
        """``buffer`` (budgeted, at least ``nbytes``) holds ``entry``'s first ``nbytes`` from the next write on."""
        entry.prefix, entry.prefix_nbytes, entry.prefix_dirty = buffer, nbytes, False

    def drop_prefix(self, entry: Entry) -> None:
        """Give ``entry``'s prefix buffer back unwritten (its bytes are elsewhere, or dead)."""
        if entry.prefix is not None:
            self.source.release(entry.prefix)
            entry.prefix, entry.prefix_nbytes, entry.prefix_dirty = None, 0, False

    def write_prefix(self, entry: Entry) -> None:
        """Write ``entry``'s dirty prefix to its file and wait. The one wait with the store's lock held: these
        writes come at a flush, when memory is given back, or once when a grown budget lets the tensor be kept
        whole, not at every use, and holding the lock keeps the prefix from changing or going while it is
        written (no I/O completion takes the lock). A failed write raises and leaves the prefix dirty: its bytes
        are never dropped."""
        if entry.prefix is None or not entry.prefix_dirty:
            return
        future = self.io.write(self._prefix_view(entry), entry.path, file_offset=0)
        started = self.recorder.clock()
        _wait_quietly(future)
        waited = self.recorder.clock() - started
        self.counters.io_wait_s += waited
        self.recorder.stalled(waited)  # the profile's compute excludes I/O waits
        if future.exception() is not None:
            raise future.exception()
        entry.prefix_dirty = False

    def store_prefix_part(self, entry: Entry, offset: int, part: torch.Tensor) -> Tuple[int, torch.Tensor]:
        """The elements of ``part`` (flat, to go at element ``offset``) that fall in ``entry``'s prefix are copied
        into it; returns (offset, rest) of what is left for the file."""
        inside = max(0, min(part.numel(), self._prefix_elements(entry) - offset))
        if inside:
            self._prefix_view(entry).narrow(0, offset, inside).copy_(part.narrow(0, 0, inside))
            entry.prefix_dirty = True
        return offset + inside, part.narrow(0, inside, part.numel() - inside)

    def copy_into(self, entry: Entry, into: torch.Tensor) -> None:
        """A held entry read into the caller's ``into``: copied now, a read that is done when waited for."""
        into.narrow(0, 0, entry.numel).copy_(self.compute_view(entry))
        entry.external_read = Future()
        entry.external_read.set_result(None)
        entry.external_read.target = into

    def _read_timer(self, entry: Entry, access: Optional[int]) -> Callable[[Future], None]:
        """The done-callback that times ``entry``'s read: into the recorded access, or, for a read ahead whose use
        is recorded later, into its pending use."""
        if access is not None:
            return self.recorder.read_timer(access)
        clock, pending = self.recorder.clock, PendingUse(issued_at=self.recorder.clock())
        entry.pending_use = pending

        def finished(future: Future) -> None:
            pending.done_at = clock()
        return finished

    def record_pending_use(self, entry: Optional[Entry]) -> None:
        """Record the use of a read ahead now that it comes, with its read's time."""
        if entry is None or entry.pending_use is None:
            return
        pending, entry.pending_use = entry.pending_use, None
        access = self.recorder.touch(entry.key, self.swap_nbytes(entry.numel))
        if pending.issued_at is not None:
            done = pending.done_at if pending.done_at is not None else self.recorder.clock()
            self.recorder.read_took(access, done - pending.issued_at)

    # -------------------------------------------------------------------------------------------- writes
    def start_write(self, entry: Entry, evicting: bool) -> None:
        self.fence(entry.buffer)
        view = self.swap_view(entry)
        skip = 0
        if entry.prefix is not None:  # a transient buffer (a kept one has no prefix): the prefix takes its bytes
            self._prefix_view(entry).copy_(view.narrow(0, 0, self._prefix_elements(entry)))
            # The whole tensor goes to a file shared with a checkpoint: a partial write would copy the file first.
            entry.prefix_dirty = not is_shared(entry.path)
            if entry.prefix_dirty:
                skip = self._prefix_elements(entry)
                self.counters.prefix_write_bytes_saved += entry.prefix_nbytes
        try:
            entry.io = self.io.write(view.narrow(0, skip, view.numel() - skip), entry.path,
                                     file_offset=skip * self.element_size)
        except BaseException:  # refused before it started (a shared file copied first on a full disk), or its
            # submission interrupted (the engine raises with none of its bytes moving): as a failed write
            self._write_failed(entry)
            raise
        entry.evicting = evicting
        self.counters.written_back += 1
        self.table.set(entry, S.WRITING)

    def wait_write(self, entry: Entry, postponed: Optional["PostponedInterrupt"] = None) -> None:
        """Wait for ``entry``'s write (lock released meanwhile) and apply its outcome; raises a failed write's
        error with the entry DIRTY again (its bytes are kept, still owed to the file). Before using an entry: its
        write in flight, if any, is all a read of it waits for. With ``postponed``, an interruption of the wait is
        kept there for the caller to raise once its books are done."""
        while entry.state == S.WRITING:
            write = entry.io
            error = self.wait_unlocked(write) if postponed is None else postponed.wait(write)
            # With the lock released, another thread may have applied this write (reap_writes) and started other
            # I/O of the entry: a read's outcome is its reader's to apply (helper-238: the waiter raised the read's
            # error and left the entry ON_FILE under its reader), and a later write is waited for in turn
            # (helper-239: a read then started on it); this write's failure is raised all the same
            if entry.state == S.WRITING and entry.io is write:
                if postponed is None:
                    self.finish_io(entry)
                else:
                    postponed.finish_io(entry)
            elif error is not None:
                if postponed is not None:
                    postponed.raise_if_any()  # (the user's Ctrl-C first, as PostponedInterrupt.finish_io)
                raise error

    def reap_writes(self) -> None:
        """Apply the outcome of writes that finished on their own (frees their buffers); never waits."""
        for entry in [entry for entry in self.table.writing() if entry.io.done()]:
            self.finish_io(entry, raise_error=False)

    def finish_io(self, entry: Entry, raise_error: bool = True) -> None:
        """Apply the outcome of ``entry``'s finished read or write (no-op if another thread already did). A failed
        write leaves the entry DIRTY (retried at its next eviction or flush); ``raise_error`` False when the caller
        is not the one that needed the write (the error is logged and counted, and raised by that retry)."""
        if entry.state not in IO_IN_FLIGHT or not entry.io.done():
            return
        error = entry.io.exception()
        if entry.state == S.READING:
            if error is not None:
                self.drop(entry, S.ON_FILE)
                raise error
            entry.io = None
            self.table.set(entry, S.LENT_CLEAN)
            if entry.prefix is not None and entry.kept:  # the kept buffer holds the whole tensor now
                owed = entry.prefix_dirty
                self.drop_prefix(entry)
                if owed:
                    self.table.set(entry, S.LENT_DIRTY)
            return
        if error is not None:
            self._write_failed(entry)
            if raise_error:
                raise error
            logger.warning("%s: writing %s failed (%s); its bytes stay in host memory and the write is retried "
                           "when it is evicted or flushed", self.name, entry.path, error)
            return
        if entry.evicting or not self.keeps(entry):
            self.drop(entry, S.ON_FILE)
        else:
            entry.io = None
            self.table.set(entry, S.CLEAN)

    def keeps(self, entry: Entry) -> bool:
        """Does ``entry``'s buffer stay after its bytes are on file? Not where it is held only because a write of
        it failed (``_write_failed``): a transient buffer goes back once a retry writes its bytes."""
        return entry.kept and self.source.keeps(entry.buffer)

    def _write_failed(self, entry: Entry) -> None:
        """``entry``'s write failed: its bytes stay in its buffer, still owed to the file (DIRTY). A transient
        buffer is held until a retry writes them: at the entry's next release or eviction, or a flush; then it
        goes back (``keeps``), where it would otherwise stay a held copy outside the budget for good."""
        entry.io, entry.evicting, entry.write_failed = None, False, True
        if not entry.kept:  # a transient buffer holding owed bytes: keep it, counted as held
            entry.kept = True
            if entry.prefix_dirty:  # the write was past the prefix: those bytes were not saved after all
                self.counters.prefix_write_bytes_saved -= entry.prefix_nbytes
            self.drop_prefix(entry)  # the buffer holds every byte the prefix does
        if entry.state != S.DIRTY:
            self.table.set(entry, S.DIRTY)
        self.counters.write_errors += 1

    @staticmethod
    def read_of(entry: Optional[Entry]) -> Optional[Future]:
        """The read of ``entry`` in flight or not waited for yet (into the caller's buffer or ours), if any."""
        if entry is None:
            return None
        return entry.external_read or (entry.io if entry.state == S.READING else None)

    def wait_unlocked(self, future: Future) -> Optional[BaseException]:
        if not future.done():
            started = self.recorder.clock()
            try:  # (the release inside: an interrupt right after it still takes the lock back)
                self.lock.release()
                _wait_quietly(future)
            finally:
                _acquire_through_interrupts(self.lock)
            waited = self.recorder.clock() - started
            self.counters.io_wait_s += waited
            self.recorder.stalled(waited)  # the profile's compute excludes I/O waits
        return future.exception()

    def close(self) -> None:
        self.staging.close()


class PostponedInterrupt:
    """Waits whose interruption (Ctrl-C) is raised only once the caller's bookkeeping is done: the I/O has ended by
    then (``_wait_quietly``), so a caller that applies it first leaves no entry READING for good: a release, a
    forget, a lend whose caller never gets the view. ``wait`` returns the I/O's own error, as ``wait_unlocked``."""

    def __init__(self, transfers: Transfers):
        self._transfers = transfers
        self.error: Optional[BaseException] = None

    def wait(self, future: Future) -> Optional[BaseException]:
        try:
            return self._transfers.wait_unlocked(future)
        except BaseException as err:  # noqa: BLE001  only an interruption comes here (_wait_quietly)
            self.error = self.error or err
            return future.exception()

    def raise_if_any(self) -> None:
        if self.error is not None:
            raise self.error

    def finish_io(self, entry: Entry) -> None:
        """``Transfers.finish_io(entry)`` after a ``wait``: a failed read's error raised in its place is the context
        of the interruption, which is raised (the user's Ctrl-C is not lost to an I/O error)."""
        try:
            self._transfers.finish_io(entry)
        except BaseException:
            self.raise_if_any()
            raise


def _acquire_through_interrupts(lock) -> None:
    """``lock.acquire()`` (an RLock: its owner is known) that an interruption does not give up: Ctrl-C may land in
    the acquire (it is interruptible) or right after it returned, and the caller's books and its ``with`` block's
    release need the lock held, once. The interruption is raised once it is."""
    interrupted = None
    while True:
        try:
            if not lock._is_owned():  # (taken already where the interrupt came right after the acquire)
                lock.acquire()
            break
        except BaseException as err:  # noqa: BLE001  raised below, with the lock held
            interrupted = interrupted or err
    if interrupted is not None:
        raise interrupted


def _wait_quietly(future: Future) -> None:
    try:
        future.result()
    except BaseException as err:
        if future.cancelled() or (future.done() and err is future.exception()):
            return  # the I/O's own outcome: the caller reads future.exception() and decides
        # the wait itself was interrupted (Ctrl-C), even as the I/O ended: the I/O still uses its buffer, and some
        # callers no longer track it, so it ends first
        concurrent.futures.wait([future])
        raise


def all_done(futures: Sequence[Future]) -> Future:
    """A future done once every one of ``futures`` is, with the first exception among them (done at once where
    there are none)."""
    combined, left = Future(), [len(futures)]
    lock = threading.Lock()

    def one_done(_future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        # a cancelled one is an error too (its exception() would raise CancelledError inside this callback, which
        # Future swallows: ``combined`` would then never be done, and its entry READING for good)
        errors = [concurrent.futures.CancelledError() if future.cancelled() else future.exception()
                  for future in futures]
        error = next((error for error in errors if error is not None), None)
        if error is not None:
            combined.set_exception(error)
        else:
            combined.set_result(None)

    if not futures:
        combined.set_result(None)
    for future in futures:
        future.add_done_callback(one_done)
    return combined
