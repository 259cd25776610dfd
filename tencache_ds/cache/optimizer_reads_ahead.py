"""The optimizer state read before an update asks for it, for one optimizer swapper. Owns: which files' reads were
started for which sub-group (the sub-group's swap-in takes them: ``take``), the reads of the first sub-groups' state
during backward, the next sub-group's during each update, and giving every one back (a purge, close). Which files a
sub-group's update reads (all but a master its parameter partitions fill) is the swapper's answer
(``paths_to_read``); the store decides whether a read may start now (cache/optimizer_store.py).

Why during backward: beyond host memory the update is bound by its reads and writes while the drive idles through
the backward, and the streaming slots the reads go into are in memory either way (docs/benchmarks.md, "Every idle
streaming slot read ahead in backward"). The bytes are the same; only when they move changes.

The first sub-group's state is often still being written behind by the last update when the backward begins (one
sub-group: the very tensors the next update reads): those reads start once the writes are done, at the first
``after_writes`` call after that (the backward calls it at each gradient it reduces: install.py), never by waiting
for those writes (the read itself takes a buffer as any read ahead at the backward's start does).
"""
from typing import Callable, Dict, List, Sequence

from .entry import EntryState


class ReadsAhead:
    """Args:
        store: the swapper's OptimizerStore.
        paths_to_read: swap_info -> the files of that sub-group's master and state tensors its update reads.
        gradient_path: swap_info -> its gradient's file.
    """

    def __init__(self, store, paths_to_read: Callable[[object], List[str]], gradient_path: Callable[[object], str]):
        self.store = store
        self._paths_to_read = paths_to_read
        self._gradient_path = gradient_path
        self._started: Dict[object, List[str]] = {}  # sub-group id -> files whose reads were started for it
        # sub-group id -> files of the first sub-group still being written behind when the backward began: read
        # once written (after_writes)
        self._after_writes: Dict[object, List[str]] = {}
        self.in_backward = 0  # COUNT: tensors of sub-groups after the first read ahead in backward
        self.after_their_writes = 0  # COUNT: tensors of the first sub-group read ahead once written (after_writes)
        self.before_own_waits = 0  # COUNT: tensors of the next sub-group started before the update's own waits

    def take(self, group) -> Sequence[str]:
        """The files whose reads were started for ``group``, now its swap-in's to wait for (and no longer here); any
        still waiting for their writes are the swap-in's to read."""
        self._after_writes.pop(group, None)
        return self._started.pop(group, ())

    def during_backward(self, sub_groups: Sequence, lent, last_backward: bool) -> None:
        """The update starts with the first sub-group (of ``sub_groups``, in the update's order): read its state
        (master weights and moments; its gradient is being produced by this backward) while the backward computes.
        Then, in the step's ``last_backward`` only, read the next sub-groups' state, in the update's order, into
        streaming slots that sit idle until the update. Never by waiting or evicting, with no memory beyond the
        budget's room and those slots, and never the slots the update needs before the next one frees: the first
        sub-group's gradient (filled from stage 3's buffer, or read) and the second one's where it is on file (read
        ahead while the first steps). (Only in the last backward of gradient accumulation: the governor's readings
        before the other forward passes then see those slots idle, as they were planned; the first sub-group's
        state is read in the first backward, as before: three slots.) Sub-groups in ``lent`` are swapped in
        already."""
        if not sub_groups:
            return
        # The last update's writes behind (often done in the forward pass) leave their entries WRITING and their
        # slots taken until reaped: read as such, the first sub-group's state was never read ahead in backward
        # (one sub-group at 25% or streaming: the whole read waited for in the update).
        self.store.reap_writes()
        if sub_groups[0].param_id not in lent:
            self._start(sub_groups[0], with_gradient=False, later_if_writing=True)
        if not last_backward:
            return
        second_gradient = self._gradient_path(sub_groups[1]) if len(sub_groups) > 1 and \
            sub_groups[1].has_gradients() else None
        stored_gradient = second_gradient is not None and self.store.knows(second_gradient) and \
            self.store.state(second_gradient) == EntryState.ON_FILE
        spare = self.store.idle_streaming_slots() - 1 - stored_gradient
        for swap_info in sub_groups[1:]:
            if spare <= 0:
                break
            if swap_info.param_id not in lent:
                started = self._into_idle_slots(swap_info, spare)
                self.in_backward += started
                spare -= started

    def next_sub_group_if_free(self, swap_info, spare: int) -> None:
        """Before the update waits for the reads of the sub-group it steps: start reading the next one's state
        tensors that are on file into streaming slots idle now, at most ``spare`` of them, never waiting or
        evicting, and none the budget has room for (that room is the current swap-in's to take first).
        ``next_sub_group`` starts the rest once those waits are over.

        Why before: started after them, the next sub-group's reads reached the I/O engine just after the last
        update's writes behind, which took both of its threads the moment the current reads ended, and the reads
        waited behind them while the drive had idle moments elsewhere in the update (io/direct_io.py;
        docs/benchmarks.md, "The next sub-group read beside the last one's writes")."""
        if spare <= 0:
            return
        self.before_own_waits += self._into_idle_slots(swap_info, spare, room=False)

    def next_sub_group(self, swap_info) -> None:
        """Start reading the entries of the sub-group the update steps next (``async_parameter``), its gradient too,
        that are on file (held ones need no read)."""
        self.store.reap_writes()
        self._start(swap_info, with_gradient=True)

    def after_writes(self) -> None:
        """Start the reads the backward's start left for writes in flight, of those whose writes are done now. Never
        waits for a write; nothing to do (the usual case) costs one dictionary test.

        The state read and the read started are two calls on the store: nothing else changes these entries between
        them, since this runs inside the backward (a gradient hook), while the training thread that swaps them in
        and out is blocked in it."""
        if not self._after_writes:
            return
        self.store.reap_writes()
        for group, paths in list(self._after_writes.items()):
            started = self._started.setdefault(group, [])
            waiting = []
            for path in paths:
                state = self.store.state(path)
                if state == EntryState.WRITING:
                    waiting.append(path)
                elif state == EntryState.ON_FILE and path not in started:
                    self.store.start_read(path, prefetch=True)
                    started.append(path)
                    self.after_their_writes += 1
            if waiting:
                self._after_writes[group] = waiting
            else:
                del self._after_writes[group]

    def release_all(self) -> None:
        """Give back every read started ahead; one that failed (its file missing, say) is raised after the rest, and
        an interrupt (Ctrl-C during a wait, which the store raises once that entry went back) before any error: it
        stopped the loop until 2026-12-07, the reads not yet given back left READING and known to nobody, and every
        later swap-in of their sub-groups raised "already lent or being read" (helper-203)."""
        self._after_writes = {}
        started, self._started = self._started, {}
        failure = interrupt = None
        for paths in started.values():
            for path in paths:
                try:
                    self.store.release(path)
                except Exception as err:  # noqa: BLE001  (raised once all are given back)
                    failure = failure or err
                except BaseException as err:  # noqa: BLE001  (KeyboardInterrupt, SystemExit: raised first)
                    interrupt = interrupt or err
        if interrupt is not None:
            raise interrupt
        if failure is not None:
            raise failure

    def _start(self, swap_info, with_gradient: bool, later_if_writing: bool = False) -> None:
        """Start reading the sub-group's files that are on file; with ``later_if_writing``, those being written
        are read once written (``after_writes``)."""
        paths = self._paths_to_read(swap_info)
        if with_gradient and swap_info.has_gradients():
            paths.append(self._gradient_path(swap_info))
        started = self._started.setdefault(swap_info.param_id, [])
        for path in paths:
            if path in started or not self.store.knows(path):
                continue
            state = self.store.state(path)
            if state == EntryState.ON_FILE:
                self.store.start_read(path, prefetch=True)
                started.append(path)
            elif state == EntryState.WRITING and later_if_writing:
                waiting = self._after_writes.setdefault(swap_info.param_id, [])
                if path not in waiting:  # (each backward of an accumulation window looks again)
                    waiting.append(path)

    def _into_idle_slots(self, swap_info, limit: int, room: bool = True) -> int:
        """Start reading up to ``limit`` of the sub-group's state tensors that are on file into buffers free right
        now (room the budget has, else idle streaming slots; ``room`` False: idle slots only, and none of a tensor
        the budget has room for); the rest are read when the update asks (``next_sub_group``). Returns how many
        were started."""
        started = self._started.setdefault(swap_info.param_id, [])
        count = 0
        for path in self._paths_to_read(swap_info):
            if count < limit and path not in started and self.store.knows(path) and \
                    self.store.prefetch_if_free(path, idle_slot=True, room=room):
                started.append(path)
                count += 1
        return count
