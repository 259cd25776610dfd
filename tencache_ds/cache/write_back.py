"""New bytes into a store, and owed bytes out to the files. Owns: storing a whole tensor or parts of it (kept dirty
while the tier has room: write-back), writing lent bytes through, and flushing (checkpoints, close, a reader outside
the store). Does not own: lending (cache/entry_store.py, whose ``lend_new`` and ``release`` these calls finish
with), the I/O itself (cache/transfers.py), finding buffers (cache/admission.py).
"""
from typing import Callable, Hashable, Iterable, List, Optional, Sequence, Tuple

import torch

from ..memory.device_staging import StagedDeviceCopy
from .admission import Admission
from .entry import LENT, EntryState
from .transfers import PostponedInterrupt, Transfers

S = EntryState


class WriteBack:
    """The writing calls of one store. ``checked``: the store's debug check (lock held); ``lend_new`` and
    ``release``: the store's own (they take the lock); ``device_copy``: how parts on a device reach host memory."""

    def __init__(self, transfers: Transfers, admission: Admission, checked: Callable[[], None],
                 lend_new: Callable[..., torch.Tensor], release: Callable[..., None], device_copy: StagedDeviceCopy):
        self._transfers = transfers
        self._device_copy = device_copy
        self._table = transfers.table
        self._admission = admission
        self._checked = checked
        self._lend_new = lend_new
        self._release = release

    def _refuse_if_in_use(self, entry) -> None:
        if entry.state in LENT or entry.state == S.READING or entry.external_read is not None:
            raise RuntimeError(f"{self._transfers.name}: tensor {entry.key} is lent or being read")

    def store(self, key, source: torch.Tensor) -> None:
        """``source`` (cast to our dtype) becomes ``key``'s newest bytes: into its held buffer or a new one, kept
        dirty (write-back), or written now when it cannot be kept."""
        transfers = self._transfers
        lent = False  # set LENT_DIRTY here: released whatever comes after (Ctrl-C: helper-171)
        try:
            with transfers.lock:
                entry = self._table[key]
                transfers.wait_write(entry)
                self._refuse_if_in_use(entry)
                was_on_file = entry.state == S.ON_FILE
                if was_on_file:
                    transfers.attach(entry, *self._admission.acquire(transfers.swap_nbytes(entry.numel), key,
                                                                     needed_now=False))
                else:
                    transfers.fence(entry.buffer)
                self._fill(entry, lambda view: view.copy_(source))
                # the new bytes replace the whole tensor: its prefix is dead. Not dropped before: an acquire that
                # raised would have left the file's older first bytes the newest (an acquire that needs the prefix's
                # room writes it first, a write for nothing: the price of that order)
                if was_on_file:
                    transfers.drop_prefix(entry)
                self._table.set(entry, S.LENT_DIRTY)
                lent = True
        finally:
            if lent:
                self._release(key)

    def _fill(self, entry, fill: Callable[[torch.Tensor], None]) -> None:
        """``fill(view)`` of ``entry``'s buffer, with the lock held and the entry in its old state: a fill that
        raises (a tensor of another size, a device copy that fails, Ctrl-C) leaves the newest bytes where they were,
        not a half-filled buffer lent for good (every flush, so every checkpoint, then stopped on it). On file: the
        buffer just attached goes back. Clean: the file holds them, the touched buffer goes. Dirty: its buffer was
        their only copy, so it stays, owed to the file as before."""
        try:
            fill(self._transfers.compute_view(entry))
        except BaseException:
            if entry.state == S.ON_FILE:
                self._transfers.release_buffer(entry)
            elif entry.state == S.CLEAN:
                self._transfers.drop(entry, S.ON_FILE)
            raise

    def write_parts(self, key, numel: int, path: str, parts: Sequence[Tuple[int, torch.Tensor]]) -> None:
        """Place each (element offset, tensor) of ``parts`` into ``key``'s bytes, the rest left as it was (stage 3
        stores a sub-group's gradient fragments reduce bucket by reduce bucket; at one rank on a host accelerator,
        gradient by gradient). Held: copied into the buffer, no I/O. On file: written at their offsets, nothing read
        back. New: a buffer, zeros between the parts (a new file is sparse). Recorded as one use in every case: the
        recorded order must not depend on what the tier happens to hold, or the profile would stop predicting the step
        as soon as the tier follows it.

        The writes to a file run with the lock released and the entry still on file: the caller (stage 3's one
        training thread) starts no read of ``key`` meanwhile, and a read already pending is refused above."""
        transfers = self._transfers
        placed = False  # the parts are in a lent buffer: released whatever comes after (Ctrl-C: helper-171)
        try:
            with transfers.lock:
                entry = self._table.get(key)
                if entry is not None:
                    transfers.wait_write(entry)
                    self._refuse_if_in_use(entry)
                    transfers.recorder.touch(key, transfers.swap_nbytes(entry.numel))
                    if entry.state == S.ON_FILE:
                        self._write_parts_to_file(entry, parts)
                        return
                    transfers.counters.stored_in_held += 1
                    transfers.fence(entry.buffer)
                    self._fill(entry, lambda view: self._place(view, parts))
                    self._table.set(entry, S.LENT_DIRTY)
                    placed = True
            if entry is None:
                view = self._lend_new(key, numel, path)
                try:
                    with transfers.lock:
                        transfers.recorder.touch(key, transfers.swap_nbytes(numel))
                    view.zero_()
                    self._place(view, parts)
                    placed = True
                except BaseException:
                    if not placed:  # a new tensor half placed: it goes (held lent, every flush would stop on it)
                        with transfers.lock:
                            transfers.forget(self._table[key])
                    raise
        finally:
            if placed:
                self._release(key, changed=True)

    def _write_parts_to_file(self, entry, parts: Sequence[Tuple[int, torch.Tensor]]) -> None:
        """``write_parts`` on an entry on file: each part written at its offset, nothing read back. Every write is
        waited for, an interruption raised once all have ended: a retry must not race writes of the same offsets
        still landing, and no write's error may go unseen (helper-171)."""
        transfers, writes, stopped = self._transfers, [], None
        try:
            for offset, flat in self._on_host(parts):
                if entry.prefix is not None:  # the elements in the prefix go there
                    offset, flat = transfers.store_prefix_part(entry, offset, flat)
                if flat.numel():
                    writes.append(transfers.io.write(flat, entry.path, file_offset=offset * transfers.element_size))
        except BaseException as err:  # the writes started end first, whatever stopped the others (helper-224)
            stopped = err
        postponed = PostponedInterrupt(transfers)
        errors = [postponed.wait(write) for write in writes]
        if stopped is not None:
            raise stopped
        _raise_first(errors)  # the bytes are owed to the file: never dropped quietly
        postponed.raise_if_any()

    def _place(self, view: torch.Tensor, parts: Sequence[Tuple[int, torch.Tensor]]) -> None:
        self._device_copy.copy([(view.narrow(0, offset, part.numel()), part) for offset, part in parts])

    def _on_host(self, parts: Sequence[Tuple[int, torch.Tensor]]) -> List[Tuple[int, torch.Tensor]]:
        """Each part as a flat host tensor of the store's dtype: a host part cast where its dtype differs (as it is
        where not), one on a device through the staging chunks."""
        dtype, on_host, from_device = self._transfers.dtype, [], []
        for offset, part in parts:
            if not self._device_copy.stages(part):
                flat = part.reshape(-1).to(device="cpu", dtype=dtype).contiguous()
            else:
                flat = torch.empty(part.numel(), dtype=dtype)
                from_device.append((flat, part))
            on_host.append((offset, flat))
        self._device_copy.copy(from_device)
        return on_host

    def write_and_release(self, keys: Iterable) -> None:
        """Write each lent key's bytes (new, or changed by the borrower) to its file, wait, and let the buffers go
        (zero.Init's first write of a partition, and its re-partitioning after a gathered parameter was modified)."""
        transfers = self._transfers
        postponed = PostponedInterrupt(transfers)  # interrupted, the writes are still made, then it is raised
        with transfers.lock:
            entries = [self._table[key] for key in keys]
            for entry in entries:
                if entry.state == S.READING:  # read ahead (no use comes for it: its bytes are replaced)
                    entry.prefetched, entry.pending_use = False, None
                    postponed.wait(entry.io)
                    postponed.finish_io(entry)
                if entry.state not in LENT:
                    raise RuntimeError(f"{transfers.name}: tensor {entry.key} is not lent ({entry.state.value})")
                if entry.state == S.LENT_CLEAN:
                    self._table.set(entry, S.LENT_DIRTY)
                transfers.start_write(entry, evicting=True)
            for entry in entries:
                transfers.wait_write(entry, postponed)
            self._checked()
        postponed.raise_if_any()

    def flush(self, skip: Optional[Callable[[Hashable], bool]] = None, lent_stay: bool = False) -> int:
        """Write every dirty held entry, and every dirty prefix, to its file and wait; they stay held, clean (a
        transient buffer held only for a failed write's bytes goes back: ``Transfers.keeps``). Returns how many were
        written. Lent entries must have been released (a checkpoint is taken between steps), unless ``lent_stay``:
        then they stay lent, as they are (their borrower holds their newest bytes: a parameter stage 3 keeps
        gathered when its engine goes). ``skip(key)``: leave that entry dirty (a checkpoint does not need it)."""
        transfers = self._transfers
        with transfers.lock:
            lent_dirty = [entry.key for entry in self._table if entry.state == S.LENT_DIRTY]
            if lent_dirty and not lent_stay:
                raise RuntimeError(f"{transfers.name}: cannot flush while tensors {lent_dirty[:5]} are lent and "
                                   f"changed")
            dirty = [entry for entry in self._table if entry.state == S.DIRTY and (skip is None or not skip(entry.key))]
            for entry in dirty:
                transfers.start_write(entry, evicting=False)
            for entry in self._table.writing():
                transfers.wait_write(entry)
            prefixes = [entry for entry in self._table if entry.prefix_dirty and (skip is None or not skip(entry.key))]
            for entry in prefixes:
                transfers.write_prefix(entry)
            self._checked()
            return len(dirty) + len(prefixes)

    def flush_key(self, key) -> None:
        """Make ``key``'s file hold its newest bytes (a reader outside the store is about to open it)."""
        transfers = self._transfers
        with transfers.lock:
            entry = self._table[key]
            if entry.state == S.LENT_DIRTY:
                raise RuntimeError(f"{transfers.name}: cannot flush tensor {key} while it is lent and changed")
            if entry.state == S.DIRTY:
                transfers.start_write(entry, evicting=False)
            transfers.wait_write(entry)
            transfers.write_prefix(entry)

    def wait_writes(self) -> None:
        """Wait for the writes in flight (none is started): the transient buffers they were writing from go back.
        Raises a failed write's error (its bytes stay held, owed to the file)."""
        with self._transfers.lock:
            for entry in self._table.writing():
                self._transfers.wait_write(entry)
            self._checked()


def _raise_first(errors: Sequence[Optional[BaseException]]) -> None:
    for error in errors:
        if error is not None:
            raise error
