"""The fp32 masters' writes, kept out of the steps. Owns: which sub-groups' master files are owed the bytes their
parameter partitions hold, writing them from the partitions only where something needs the file, and waiting for
those writes (``settle``), and for the reads of partitions' files that fill a master (``filling``), wherever a
partition could change, or a master file be read, first.

Why: beyond host memory the update is bound by the drive. Each sub-group's master is stepped, copied back into its
parameter partitions by stage 3, and its file written: 4.75 GiB a step on gpt2-1.3b, a third of the update's
writes; on gpt2-2.7b, whose partitions stream, 10.4 GB beside the same bytes written again as the partitions. After
the update the partitions are the new master, bit for bit (master_copies.py), wherever they are: in host memory,
unchanged through the next forward and backward, or written to their own files (an eviction writes a partition's
bytes, it does not change them). The next update fills the master from them (copied, or read from the partitions'
files) without reading its file. So nothing reads that file in a step: the update gives the master back without
writing it (its slot is free at once), and the file gets the bytes only where something is about to read it, or
to change one of the partitions (``settle``: a checkpoint, an edit of a weight, the end of the run). Step after
step the masters' files cost the drive nothing. The next update of an owed master takes the debt over
(``take_over``): what it gives back is owed again (or written by its store).

When a master is owed: a swap-in gave it back changed, or lent it with the debt taken over (a getter's swap-in gives
it back unchanged, still owed), and its partitions are a current copy of it (master_copies.py ``current``, anywhere).

The rule that keeps every result stock's: nothing may read an owed master's file, or change one of its partitions,
before its write is done. ``settle`` (start what is owed, then wait) runs first at each such place:
- the optimizer swapper: every swap-in that reads the master's file (one whose partitions fill it takes the debt
  over instead; a read ahead of an owed master reads the partitions, never its file), the checkpoint save's reads
  of the master files (checkpoint_save.py; a ZeRO file saved in two passes settles a master whose partitions are
  not all in host memory as its writer reaches it, and writes its copy from the memory the settle writes the file
  from: ``settled_with``) and its and a load's flush, a purge, close;
- the parameter swapper (``settle_owed_masters``): every call that writes a partition (zero.Init's writes, stage
  3's copy of a master, a hand-over to stage 3's buffer), an engine's destroy and close (its files and I/O go);
- a partition changed in place: at ``GatheredParameters.__enter__`` (at one rank on a host accelerator the gathered
  tensor is the partition itself, which code inside the context may change), and where DeepSpeed writes gathered
  values back (``Init._partition`` with ``has_been_updated``: a modifier rank's exit, ``module.apply`` under zero.Init,
  the compile fallback); install.py;
- a checkpoint load's adoption of files under other ids, before it renames them (checkpoint.py).
A partition evicted or read is not changed: neither settles. A settle writes from the partitions' host memory where
all of them are there, and otherwise from a copy it fills as an update does (reading those on file); it waits for its
writes before it returns, on the caller's thread, which is the thread of every call that may evict a partition, so
no eviction lands while a write reads a partition's memory. Where it settles several masters (and where a
checkpoint's ZeRO file names the master it writes next: ``settled_with``'s ``then``), the next master's fill starts
while the last one's writes run, a fill like any other (a change to its partitions waits for its reads), in two
copies' memory used again from master to master: a save of gpt2-2.7b settles 26 masters of 400 MB, which one copy at
a time, fresh for each, left the drive idle between a fill and the writes and paid a page fault a page.
A master file linked into a checkpoint is replaced by an empty one of its size before its writes, never copied
(io/shared_files.py ``make_own_file``). A write that fails, or cannot be issued (a full disk), leaves the master
owed, its partitions unchanged (a change of one settles first, and raises the error again): the next settle writes
it again, so a save stopped by a full disk can be made again once there is room, and training goes on meanwhile
(the update takes an owed master's debt over without its file), as it does after stock's failed copy. Only a master
left with nothing to write it from (``stale_for_good``) stops every later settle.
"""
import concurrent.futures
import contextlib
import threading
import weakref
from concurrent.futures import Future
from typing import Callable, Dict, Hashable, Iterable, Iterator, List, Optional, Tuple

import torch

from ...io.direct_io import aligned_buffer
from ...io.shared_files import make_own_file
from ...log import logger

_LIVE = weakref.WeakSet()  # every MasterWriteBehind not closed: the parameter swapper settles them all
_LIVE_LOCK = threading.Lock()


def settle_owed_masters(partition_ids: Optional[Iterable[Hashable]] = None) -> None:
    """Write what every live optimizer owes the master files made of the partitions ``partition_ids`` (their
    ``ds_id``; None: of any partition) and wait, and wait for the reads of those partitions' files that fill a
    master (``filling``), before a partition changes (see the module's rule). Cheap when nothing is owed or read.
    Every writer is settled, and its fills waited for, before the first error is raised (one optimizer's stale file
    must not leave another's masters unwritten); a writer whose master file is behind for good (``stale``) raises
    here only for every partition (None: a close, an engine's destroy), not for a change of some partitions, which
    it cannot tell apart from its own (its debt is gone with the master it lost)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    # (asked outside _LIVE_LOCK: a writer's lock may be held across a settle's reads and writes)
    writers = [writer for writer in live
               if writer.owes_any or writer.filling_any or (partition_ids is None and writer.stale)]
    ids = None if partition_ids is None else set(partition_ids)
    first_error = None
    for writer in writers:
        try:
            # none of its masters made of these partitions: nothing to settle, and a stale writer's error is not
            # raised (it stopped every partition change in the process: helper-165's review)
            groups = writer.groups_of(ids)
            if groups is None or groups:
                writer.settle(groups)
        except Exception as err:  # noqa: BLE001  (raised once every writer is settled)
            if first_error is not None:  # (logged, not lost: the first is raised)
                logger.warning("tencache: another optimizer's owed masters also failed to settle: %s: %s",
                               type(err).__name__, err)
            first_error = first_error or err
        finally:  # a failed settle too: no partition changes under a fill still reading it
            writer.wait_fills(ids)
    if first_error is not None:
        raise first_error


class MasterWriteBehind:
    """The owed master writes of one optimizer swapper.

    Args:
        partition_views: group -> (ds_ids, views) of the group's partitions, the views of the host memory holding
            them now in the master's order, or None where one is not in memory (MasterCopies.partition_views).
        partition_ids: group -> (ds_ids of its partitions, the master's numel), None where it has none
            (MasterCopies.partition_ids).
        fill: (group, tensor) -> the reads that fill the tensor with the partitions, as an update's fill does, or
            None where one cannot be had (MasterCopies.fill).
        write: the I/O engine's ``write(tensor, path, file_offset=...)`` (a LinkSafeIO's: a file linked into a
            checkpoint is copied before a partial write).
        dtype: the masters' dtype.
    """

    def __init__(self, partition_views: Callable[[Hashable], Optional[Tuple[list, List[torch.Tensor]]]],
                 partition_ids: Callable[[Hashable], Optional[Tuple[frozenset, int]]],
                 fill: Callable[[Hashable, torch.Tensor], Optional[List[Future]]], write, dtype: torch.dtype):
        self._partition_views = partition_views
        self._partition_ids = partition_ids
        self._fill = fill
        self._write = write
        self._dtype = dtype
        self._lock = threading.RLock()
        self._owed: Dict[Hashable, str] = {}             # group -> master file, write not started
        self._writing: Dict[Hashable, List[Future]] = {}  # group -> the writes of its partitions in flight
        self._writing_to: Dict[Hashable, Tuple[str, int]] = {}  # group -> (the master file they go to, their bytes)
        self._partitions: Dict[Hashable, frozenset] = {}  # group -> its partitions' ds_ids, while owed or writing
        self._copies: Dict[Hashable, torch.Tensor] = {}    # group -> the copy its writes read, until waited for
        # group -> the reads of its partitions' files that fill it (at a swap-in, or ahead of one), until done: a
        # partition's file rewritten under one would fill the master with the new bytes, or a mix
        self._fills: Dict[Hashable, Tuple[frozenset, List[Future]]] = {}
        # group -> (copy, reads): its master filled ahead of its settle, while the writes of the one before run (a
        # settle of several masters, a checkpoint's ZeRO file told which it writes next); one at a time
        self._prefilled: Dict[Hashable, Tuple[torch.Tensor, List[Future]]] = {}
        # a settled copy's memory, for the next fill of the same settle (fresh memory costs a page fault a page):
        # kept within one settle, or from one ``settled_with`` to the next it names
        self._spare: Optional[torch.Tensor] = None
        # groups whose copy ``settled_with`` shows its caller now: a settle on another thread that waits for their
        # writes must not use that memory again under the caller's reads
        self._shown: set = set()
        self.masters_written_behind = 0  # COUNT: masters written from the partitions (at a settle)
        self.bytes_written_behind = 0    # SUM: their bytes
        self.masters_filled_ahead = 0    # COUNT: of them, masters filled while the one before was written
        self._failed: Optional[BaseException] = None  # a master with nothing to write it from: stale for good
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def owes_any(self) -> bool:
        return bool(self._partitions)

    @property
    def stale(self) -> bool:
        """Is a master file behind for good (every settle raises)?"""
        return self._failed is not None

    @property
    def filling_any(self) -> bool:
        """Is a fill still reading a partition's file? (Fills done are forgotten here: settle_owed_masters asks at
        every change of a partition, and a done fill would make each take this writer's lock for nothing.)"""
        with self._lock:
            for group in [group for group, (_ids, reads) in self._fills.items() if all(r.done() for r in reads)]:
                del self._fills[group]
            return bool(self._fills)

    def filling(self, group, reads: List[Future]) -> None:
        """``reads`` of ``group``'s partitions' files fill its master now: a change to one of those partitions waits
        for them first (``settle_owed_masters``)."""
        found = self._partition_ids(group)
        if reads and found is not None:
            with self._lock:
                earlier = self._fills.get(group)
                if earlier is not None and not all(read.done() for read in earlier[1]):
                    reads = list(earlier[1]) + list(reads)  # (still reading: waited for as well)
                self._fills[group] = (found[0], list(reads))

    def wait_fills(self, partition_ids: Optional[set]) -> None:
        """Wait for the fills reading any of ``partition_ids`` (None: every fill) from their files."""
        with self._lock:
            waiting = [(group, reads) for group, (ids, reads) in self._fills.items()
                       if partition_ids is None or ids & partition_ids]
        # not under the lock: a read from the drive takes long, and the update's owe or take_over on another thread
        # must not wait for it. The fills stay recorded until done, so that a wait on another thread waits for them too.
        for _group, reads in waiting:
            concurrent.futures.wait(reads)
        with self._lock:
            for group, reads in waiting:
                if self._fills.get(group, (None, None))[1] is reads:  # (not a newer fill of the group)
                    del self._fills[group]

    def groups_of(self, partition_ids: Optional[set]) -> Optional[list]:
        """The groups owed, being written or being filled made of any of ``partition_ids`` (None: every group)."""
        if partition_ids is None:
            return None
        with self._lock:
            made_of = {**{group: ids for group, (ids, reads) in self._fills.items()  # (done ones: none to settle)
                          if not all(read.done() for read in reads)}, **self._partitions}
            return [group for group, ids in made_of.items() if ids & partition_ids]

    def owe(self, group, path: str) -> bool:
        """The update gives ``group``'s master back changed without writing it: its partitions, a current copy of it
        (the caller's check), hold the bytes, in host memory or on their files. False, and nothing owed, where it has
        no partitions of this optimizer's (the caller writes the master itself then)."""
        with self._lock:
            if self._failed is not None:
                raise self._failed
            if group in self._writing:  # a settle's write not waited for: never reordered
                self._wait_superseded(group)
            found = self._partition_ids(group)
            if found is None:
                return False
            self._owed[group] = path
            self._partitions[group] = found[0]
            return True

    def owes(self, group) -> bool:
        """Is ``group``'s master file behind its partitions now (a swap-in fills it from them, never from the file)?"""
        with self._lock:
            return group in self._owed

    def cancel(self, group) -> None:
        """The master ``owe`` recorded is written by its store after all (nothing was started for it)."""
        with self._lock:
            self._drop_prefilled(group)
            if self._owed.pop(group, None) is not None:
                self._partitions.pop(group, None)

    def take_over(self, group) -> bool:
        """A swap-in fills ``group``'s master from its partitions (their bytes, without reading the file): the debt
        goes with what it lends, whose give-back writes or owes the master again (masters_in_partitions.py). True where
        the master was owed and is no more; a write in flight is waited for first (the partitions change next)."""
        with self._lock:
            if self._failed is not None:
                raise self._failed
            if group in self._writing:
                self._wait_superseded(group)
            self._spare = None  # (a save stopped between two settles: its memory goes with the next update)
            self._drop_prefilled(group)  # the swap-in fills it itself
            if self._owed.pop(group, None) is None:
                return False
            self._partitions.pop(group, None)
            return True

    def stale_for_good(self, error: BaseException) -> BaseException:
        """A master file left behind with nothing to write it from: every later settle and owe raises ``error``
        (returned, for the caller to raise)."""
        with self._lock:
            self._fail(error)
            return error

    @property
    def owed_masters(self) -> int:
        """GAUGE: masters whose files are behind their partitions now."""
        with self._lock:
            return len(self._owed)

    def settle(self, groups: Optional[Iterable[Hashable]] = None, but: Iterable[Hashable] = ()) -> None:
        """Start what ``groups`` (None: every group) owe and wait for their writes; raises the first failed write's
        error (the master file is then not current: nothing may read it; it stays owed, and the next settle writes
        it again). The groups in ``but`` are left as they are, a write in flight included (``settled_with`` settles
        them)."""
        but = frozenset(but)
        with self._lock:
            if self._failed is not None:
                raise self._failed
            todo = [group for group in (list(self._partitions) if groups is None else list(groups))
                    if group not in but]
            try:
                for index, group in enumerate(todo):
                    if group in self._owed:
                        self._start(group)
                    if index + 1 < len(todo):  # the next one's reads while this one's writes run
                        self._prefill(todo[index + 1])
                    if group in self._writing:
                        self._wait(group)
            finally:
                self._spare = None
                for group in todo:  # (a settle that raised part way: nothing of it stays reading)
                    self._drop_prefilled(group)

    @contextlib.contextmanager
    def settled_with(self, group, then=None) -> Iterator[Optional[List[torch.Tensor]]]:
        """Settle ``group`` as ``settle`` does, yielding the host memory its master file's writes take their bytes
        from (the partitions' views, or the copy filled from them, one after the other the master's bytes), valid
        inside only, while those writes are in flight; waited for on the way out. None where it owed nothing (its
        file is current). A checkpoint's ZeRO file writes its copy of the master from them instead of reading the
        file back (checkpoint_save.py): one fill of the master for both. Where they are the partitions' own views,
        nothing may change a partition inside (a settle on another thread would find the writes waited for): the
        caller is the save, on the thread that changes partitions. ``then``: the group the caller settles next, whose
        fill starts here, while these writes run, in the memory this one's copy frees on the way out."""
        with self._lock:
            if self._failed is not None:
                raise self._failed
            if group in self._writing:
                self._wait(group)
            views = self._start(group) if group in self._owed else None
            shown = self._copies.get(group)  # (None where the views are the partitions')
            self._shown.add(group)
            if then is not None:
                self._prefill(then)
        try:
            yield views
        except BaseException:
            with self._lock, contextlib.suppress(Exception):  # (a failed write stays owed: the next settle raises it)
                try:
                    if group in self._writing:
                        self._wait(group)
                finally:
                    self._shown.discard(group)
                    self._spare = None
            raise
        with self._lock:
            try:
                if group in self._writing:
                    self._wait(group)
            finally:
                self._shown.discard(group)
                # its writes are done (here, or by a settle on another thread, under this lock): the next settle
                # named fills into it
                self._spare = shown if then is not None and then in self._prefilled and shown is not None else None

    def close(self) -> None:
        try:
            self.settle()
        finally:
            try:
                with self._lock:  # (settle used or dropped its own: one a stopped save left, if any)
                    for group in list(self._prefilled):
                        self._drop_prefilled(group)
                    self._spare = None
                self.wait_fills(None)  # (out of _LIVE, no settle would wait for them any more)
            finally:
                with _LIVE_LOCK:
                    _LIVE.discard(self)

    def _start(self, group) -> List[torch.Tensor]:
        """Issue ``group``'s writes; returns the memory they read. Any error leaves the master owed again, the writes
        already issued waited for first (the next settle starts them all again)."""
        path = self._owed.pop(group)
        futures, offset = [], 0
        self._writing[group] = futures
        self._writing_to[group] = (path, 0)
        try:
            found = self._partition_views(group)
            if found is not None:
                self._drop_prefilled(group)  # (its partitions came back into host memory since)
            views = found[1] if found is not None else [self._filled_copy(group, path)]
            # every byte of the master is written: a file linked into a checkpoint is replaced by an empty one of its
            # size rather than copied first (the partial writes below would copy it: shared_files.LinkSafeIO)
            make_own_file(path)
            for view in views:
                futures.append(self._write(view, path, file_offset=offset))
                offset += view.numel() * view.element_size()
        except BaseException:
            try:
                concurrent.futures.wait(futures)  # (none may still read a copy, nor land after the next settle's)
            finally:  # (a second interrupt in the wait: owed again all the same; a late write has the same bytes)
                self._writing.pop(group)
                self._writing_to.pop(group)
                self._owed[group] = path
                self._copies.pop(group, None)
                for other in list(self._prefilled):  # (a fill ahead is a settle's, which stops here)
                    self._drop_prefilled(other)
                self._spare = None
            raise
        self._writing_to[group] = (path, offset)
        return views

    def _filled_copy(self, group, path: str) -> torch.Tensor:
        """The master's bytes in memory of their own (4 KiB-aligned: written with O_DIRECT), filled from the
        partitions as an update's fill is, some read from their files: the settle's source where they are not all in
        host memory."""
        copy, reads = self._prefilled.pop(group, (None, None))
        self.masters_filled_ahead += copy is not None
        if copy is None:
            found = self._partition_ids(group)
            if found is not None:
                copy = self._copy_memory(found[1])
                reads = self._fill(group, copy)
                if reads is None:
                    copy = None
        if copy is not None:
            concurrent.futures.wait(reads)  # every read landed before any error is raised (or ``copy`` freed)
            self._forget_fill(group, reads)
            for read in reads:
                read.result()  # raises a failed read's error: the master stays owed (_start)
        if copy is None:
            raise RuntimeError(f"tencache: a parameter partition of optimizer sub-group {group} is not available to "
                               f"write its fp32 master ({path}) from")
        self._copies[group] = copy
        return copy

    def _copy_memory(self, numel: int) -> torch.Tensor:
        """Memory for a master's copy of ``numel`` elements, 4 KiB-aligned (written with O_DIRECT): the spare one
        where it is large enough, else fresh."""
        spare, self._spare = self._spare, None
        if spare is not None and spare.numel() >= numel:
            return spare[:numel]
        return aligned_buffer(numel * self._dtype.itemsize).view(self._dtype)

    def _prefill(self, group) -> None:
        """Start the fill of ``group``'s master ahead of its settle (lock held), where it is owed, its partitions
        are not all in host memory (its writes read theirs then: no copy), and no other is filled ahead. A fill that
        cannot start (its memory refused, a read refused) is left to the settle, which then says why: the callers
        have writes in flight here, which must still be waited for."""
        try:
            if (self._failed is not None or self._prefilled or group not in self._owed or group in self._writing
                    or self._partition_views(group) is not None):
                return
            found = self._partition_ids(group)
            if found is None:
                return
            copy = self._copy_memory(found[1])
            reads = self._fill(group, copy)  # (one that raises has waited for the reads it issued)
        except Exception as err:  # noqa: BLE001  (the settle's own fill raises it, and stops there)
            logger.debug("tencache: the fill of sub-group %s's master ahead of its settle failed: %s", group, err)
            return
        if reads is None:
            return
        self._prefilled[group] = (copy, reads)
        # a change to one of its partitions waits for these reads (settle_owed_masters)
        earlier = self._fills.get(group)
        still = [read for read in earlier[1] if not read.done()] if earlier is not None else []
        self._fills[group] = (found[0], still + list(reads))

    def _fail(self, error: BaseException) -> None:
        """A master file is behind for good (lock held): every later settle raises ``error`` (the first kept), so
        no fill ahead will be written, nor its memory used again."""
        if self._failed is None:
            self._failed = error
        for group in list(self._prefilled):
            self._drop_prefilled(group)
        self._spare = None

    def _drop_prefilled(self, group) -> None:
        """Forget a fill ahead that no settle took, once its reads are done (lock held)."""
        copy, reads = self._prefilled.pop(group, (None, None))
        if copy is not None:
            concurrent.futures.wait(reads)  # nothing may land in ``copy`` once it is freed
            self._forget_fill(group, reads)

    def _forget_fill(self, group, reads: List[Future]) -> None:
        """``group``'s fill of ``reads`` is done and waited for: no change to a partition waits for it any more."""
        recorded = self._fills.get(group)
        if recorded is not None and all(read in reads or read.done() for read in recorded[1]):
            del self._fills[group]

    def _wait(self, group) -> None:
        """Wait for ``group``'s writes (lock held). One that failed leaves the master owed again (its partitions, a
        current copy still: any change of them settles first) and raises its error."""
        futures = self._writing[group]
        # before any state changes: interrupted here (a save's wait is where Ctrl-C lands), the group is still
        # writing, and the next settle waits for it (popped first, its writes went on unwatched: helper-196)
        concurrent.futures.wait(futures)
        del self._writing[group]
        path, nbytes = self._writing_to.pop(group)
        copy = self._copies.pop(group, None)
        errors = [future.exception() for future in futures]  # (each done now)
        error = next((error for error in errors if error is not None), None)
        if error is not None:
            self._owed[group] = path
            for other in list(self._prefilled):  # (a fill ahead is a settle's, which stops here)
                self._drop_prefilled(other)
            self._spare = None
            raise error
        self._partitions.pop(group, None)
        self.masters_written_behind += 1  # (written: a failed attempt, retried, is not counted)
        self.bytes_written_behind += nbytes
        if copy is not None and group not in self._shown and (self._spare is None
                                                              or self._spare.numel() < copy.numel()):
            self._spare = copy  # no write reads it any more (nor, unless shown, anything else)

    def _wait_superseded(self, group) -> None:
        """Wait for ``group``'s writes where its master is about to be owed anew or taken over (lock held): a write
        that failed is no error of this call (the new debt replaces the one it was paying), and is logged."""
        try:
            self._wait(group)
        except Exception as err:  # noqa: BLE001  (logged: the debt it paid is owed again by the caller, or taken)
            logger.warning("tencache: the write of optimizer sub-group %s's fp32 master to its file failed (%s: %s); "
                           "it is owed again and written at the next settle", group, type(err).__name__, err)
