"""The fp32 masters the parameter partitions hold, as one optimizer swapper lends and takes them back. Owns: how a
sub-group's master is lent (filled from its partitions, taking over what its file is owed; or read from its file,
made current first) and how it comes back (owed to its file again, or released to the store as changed), and the
masters lent with their file's debt. The two mechanisms it combines keep their own rules: which partitions are a
current copy of which master (master_copies.py) and which master files are owed those partitions' bytes
(master_write_behind.py). optimizer_swapper.py asks it at each swap-in and give-back, and wherever a master file is
read or replaced.

Without stage 3 (an optimizer swapper made outside its initialisation) no partition holds a master: every method is
then the no-op or the False it would be with nothing held.
"""
import contextlib
import functools
from concurrent.futures import Future
from typing import Callable, ContextManager, Hashable, Iterable, List, Mapping, Optional

import torch

from .master_copies import MasterCopies
from .master_write_behind import MasterWriteBehind


class MastersInPartitions:
    """For one optimizer swapper.

    Args:
        stage3: the ZeRO-3 optimizer (None: no partition holds a master).
        dtype: the swapped masters' dtype (only partitions of it are copies).
        write: the I/O engine's write (master_write_behind.py), for the masters owed to their files.
        writes_behind: the update's writes go behind it (plan/host_tier.py ``optimizer_pipelining``): a master
            filled from its partitions then owes its file instead of being written in the update.
    """

    def __init__(self, stage3, dtype: torch.dtype, write, writes_behind: bool):
        self.copies = MasterCopies(stage3, dtype) if stage3 is not None else None
        # (a settle's fills are not an update's: not counted as its reads)
        self.writes = MasterWriteBehind(self.copies.partition_views, self.copies.partition_ids,
                                        functools.partial(self.copies.fill, counted=False),
                                        write, dtype) if self.copies is not None and writes_behind else None
        # sub-groups lent with their master filled from partitions it was owed from: whatever the borrower does, the
        # master goes back as changed (the file is behind it)
        self._lent_with_debt = set()

    # ------------------------------------------------------------------------------------------ lending
    def current(self, group) -> bool:
        """Do the partitions hold ``group``'s master now (master_copies.py ``current``)?"""
        return self.copies is not None and self.copies.current(group)

    def views(self, group) -> Optional[list]:
        """The host memory that holds ``group``'s master now: its partitions' views, in the master's order, their
        bytes one after the other the master's; None where the partitions are no current copy, or one is not in host
        memory the parameter swapper keeps. Valid until a partition is written or leaves memory (the parameter
        swapper's next call: a checkpoint's save of the ZeRO file reads them between steps)."""
        if not self.current(group):
            return None
        found = self.copies.partition_views(group)
        return None if found is None else found[1]

    def before_lend(self, group, from_partitions: bool) -> None:
        """``group`` is about to be lent. Filled ``from_partitions``: its file is not read, and what it is owed goes
        with what is lent (master_write_behind.py ``take_over``). Otherwise its file is read, and its partitions
        change in the update: what they owe it is written first."""
        if from_partitions and self.writes is not None:
            if self.writes.take_over(group):
                self._lent_with_debt.add(group)
        else:
            self.settle([group])

    def lent(self, group) -> None:
        if self.copies is not None:
            self.copies.lent(group)

    def fill(self, group, view: torch.Tensor) -> Optional[List[Future]]:
        """The store's fill of ``group``'s master from its partitions (``lend_copied``): copied from host memory, and
        the reads of those on file only (master_copies.py). Where it cannot (a partition stage 3 keeps resident is
        not available) and the master was owed, its file is behind: raised rather than read."""
        reads = self.copies.fill(group, view) if self.copies is not None else None
        if reads is not None:
            if reads and self.writes is not None:
                self.writes.filling(group, reads)  # a change to one of those partitions waits for these reads
            return reads
        if group in self._lent_with_debt or self.owed(group):
            self._lent_with_debt.discard(group)  # nothing to write it from: never given back as changed
            raise self.writes.stale_for_good(RuntimeError(
                f"tencache: a parameter partition of optimizer sub-group {group} is not available while its fp32 "
                f"master's file is behind the partitions"))
        return None

    def owed(self, group) -> bool:
        """Is ``group``'s master file behind its partitions (its swap-in fills it from them: never read the file)?"""
        return self.writes is not None and self.writes.owes(group)

    def owed_again_unlent(self, group, path: str) -> None:
        """The debt ``group``'s master took over goes back to the writer: its lend failed, or the swapper closes
        with it lent (an update that stopped: the partitions still hold the master as it was before that update,
        which its moments' files hold too). Where they are no current copy any more, the file stays behind for
        good (raised at every later settle) rather than be read or linked stale; so too where it cannot be told
        (an error in stage 3's walk of the partitions). Never raises itself: the error being handled is the one the
        caller raises."""
        if group not in self._lent_with_debt:
            return
        self._lent_with_debt.discard(group)
        try:
            owed = self._owe_from_partitions(group, path)
        except Exception as err:  # noqa: BLE001  (a writer that failed before keeps its first error)
            self.writes.stale_for_good(RuntimeError(
                f"tencache: optimizer sub-group {group}'s fp32 master was not given back, and its file ({path}) "
                f"could not be owed to its partitions again: {err}"))
            return
        if not owed:
            self.writes.stale_for_good(RuntimeError(
                f"tencache: optimizer sub-group {group}'s fp32 master was not given back, and its partitions were "
                f"changed before its file ({path}) was written from them"))

    def check_none_lent_behind(self, lent_groups: Iterable[Hashable]) -> None:
        """A save reads and links the swap files between steps: a master lent with its file's debt (a swap-in, an
        update that stopped) has no current file. Raised, as the store does for its lent changed tensors."""
        lent = set(lent_groups)
        behind = sorted(str(group) for group in self._lent_with_debt if group in lent)
        if behind:
            raise RuntimeError(f"tencache: cannot save while optimizer sub-groups {behind[:5]} are swapped in with "
                               f"their fp32 masters' files behind them (a checkpoint is taken between steps)")

    # ----------------------------------------------------------------------------------- giving back
    def released(self, group, changed: bool) -> bool:
        """``group`` comes back (``changed``: the update stepped it). Returns whether its partitions hold its master
        now: keeping its buffer would then save only its write (the store gives that room to tensors whose reads it
        saves)."""
        if self.copies is None:
            return False
        self.copies.released(group, changed)
        return self.copies.current(group)

    def forget(self, group) -> None:
        """What reached the store of ``group`` is not known: no copy of its master is trusted."""
        if self.copies is not None:
            self.copies.forget(group)

    def take_debt(self, group) -> bool:
        """Take back the debt ``group`` was lent with, if it was (True then): asked once, as it comes back."""
        owed = group in self._lent_with_debt
        self._lent_with_debt.discard(group)
        return owed

    def give_back_owed(self, group, path: str, release_unwritten: Callable[[str], bool]) -> bool:
        """Give ``group``'s changed master (at ``path``) back unwritten, owed to its file, which the partitions that
        hold its bytes fill where something needs it (master_write_behind.py): ``release_unwritten(path)`` gives the
        store's buffer back without a write (False where the store owes the file something else). False where the
        partitions are no current copy of it, or that release refused: the caller releases it as changed."""
        if self.writes is None or not self._owe_from_partitions(group, path):
            return False
        if not release_unwritten(path):
            self.writes.cancel(group)
            return False
        return True

    def _owe_from_partitions(self, group, path: str) -> bool:
        # wherever the partitions are: in host memory, or on their own files, which a fill or a settle reads
        return self.copies.current(group, anywhere=True) and self.writes.owe(group, path)

    # ---------------------------------------------------------------- files read, replaced or rebuilt
    def settle(self, groups: Optional[Iterable[Hashable]] = None, but: Iterable[Hashable] = ()) -> None:
        """Write the masters ``groups`` (None: all) but those in ``but`` owe their files from the partitions, and
        wait: before those files are read or replaced other than through a swap-in that fills them."""
        if self.writes is not None:
            self.writes.settle(groups, but)

    def settled_with(self, group, then=None) -> ContextManager[Optional[List[torch.Tensor]]]:
        """``settle`` of ``group`` alone, yielding the memory its master file is written from (None: it owed nothing),
        the fill of ``then``'s (settled next) started meanwhile: master_write_behind.py ``settled_with``."""
        return self.writes.settled_with(group, then) if self.writes is not None else contextlib.nullcontext(None)

    def copied_to_partitions(self, sub_group_index: int, group, lent: bool) -> None:
        """Stage 3 has copied sub-group ``sub_group_index``'s master (``group``) into its partitions. While it is
        ``lent`` that makes the partitions a copy of the master it is given back with; otherwise they are no copy of
        the master the store will lend next."""
        if self.copies is None:
            return
        if lent:
            self.copies.copied_to_partitions(sub_group_index, group)
        else:
            self.copies.forget(group)

    def forget_all(self) -> None:
        """The swap files are being replaced or rebuilt: no partition is known to hold what they will (what the
        partitions owe the files is written first, so that it cannot land over the new files)."""
        self.settle()
        if self.copies is not None:
            self.copies.forget_all()

    def close(self) -> None:
        if self.writes is not None:
            self.writes.close()

    def stats(self) -> Mapping[str, int]:
        """The masters written from the partitions where something needed their files (of them, those whose copy was
        filled while the one before was written), and owed to the files now."""
        writes = self.writes
        from_files = 0 if self.copies is None else self.copies.bytes_read_from_partition_files
        if writes is None:
            return {"optimizer_masters_written_behind": 0, "optimizer_master_bytes_written_behind": 0,
                    "optimizer_masters_filled_ahead": 0, "optimizer_masters_owed": 0,
                    "optimizer_master_bytes_read_from_partition_files": from_files}
        return {"optimizer_masters_written_behind": writes.masters_written_behind,
                "optimizer_master_bytes_written_behind": writes.bytes_written_behind,
                "optimizer_masters_filled_ahead": writes.masters_filled_ahead,
                "optimizer_masters_owed": writes.owed_masters,
                "optimizer_master_bytes_read_from_partition_files": from_files}
