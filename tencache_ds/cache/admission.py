"""Which entries of a store hold host buffers. Owns: finding a buffer for an incoming entry (a free one from the
buffer source; else a held entry's, chosen by plan/eviction.py's Belady over the profiled order, least recently used
while the order is unknown, unless bypassing is better; else a write in flight that frees one; else a transient
buffer, after waiting for a write that frees a streaming slot rather than mapping new memory), prefixes (room no
whole tensor fits in holds the first bytes of a streaming one: cache/entry.py), and giving held buffers and
prefixes back under memory pressure (held buffers also to a caller holding the store's lock: ``ExclusiveStore``).
Entries whose next use a copy elsewhere serves (``Entry.copy_elsewhere``) give their room up first, in either order
(plan/eviction.CopiesElsewhere), and take no prefix.
Does not own: the rules themselves (plan/eviction.py), the I/O (cache/transfers.py), where buffers come from
(cache/buffer_sources.py).

Locking: called with the store's lock held (waits for writes release it: cache/transfers.py; a prefix's own write
is waited for with it held, ``Transfers.write_prefix``).
"""
from typing import Callable, Dict, Hashable, Optional, Tuple

from ..memory.pool import HostBuffer
from ..plan.eviction import (CopiesElsewhere, choose_victim, farthest_first, kept_until, prefix_nbytes, victims_for,
                             worth_evicting)
from ..profile.next_use import NextUseIndex
from ..profile.recorder import StepRecorder
from .buffer_sources import BufferSource
from .entry import LENT, Entry, EntryState
from .entry_table import EntryTable
from .transfers import Transfers

S = EntryState


class Admission:
    """Buffers for the entries of ``table``: from ``source``, or by evicting. ``next_use``: the profiled order
    (None until a profile is known; ignored while the step has left it: ``recorder.on_track``)."""

    def __init__(self, table: EntryTable, transfers: Transfers, source: BufferSource, recorder: StepRecorder,
                 counters):
        self._table = table
        self._transfers = transfers
        self._source = source
        self._recorder = recorder
        self._counters = counters
        self.next_use: Optional[NextUseIndex] = None
        self._bypassing = False

    def _index(self) -> Optional[CopiesElsewhere]:
        if self.next_use is None or not self._recorder.on_track:  # a step that left the profile: LRU
            return None
        return CopiesElsewhere(self.next_use, self._copy_elsewhere)

    def _copy_elsewhere(self, key) -> bool:
        entry = self._table.get(key)
        return entry is not None and entry.copy_elsewhere

    def _copies_elsewhere_first(self, keys) -> list:
        """``keys`` (in LRU order) with those a copy elsewhere serves first: the order victims are taken in while
        the access order is unknown (with it, their distance puts them first: CopiesElsewhere)."""
        return sorted(keys, key=lambda key: not self._copy_elsewhere(key))

    def acquire(self, nbytes: int, incoming, use_pending: bool = False,
                needed_now: bool = True) -> Tuple[HostBuffer, bool]:
        """(buffer, kept) for ``nbytes`` of entry ``incoming``: a free buffer from the source; else a held entry
        gives its buffer up (Belady victim; a dirty one is written first, and only its write is waited for);
        else a write in flight that frees a fitting buffer is waited for; else a transient buffer.
        ``use_pending``: the read is a prefetch, its use (not yet recorded) still ahead. ``needed_now`` False:
        new bytes stored, not a use (the update's write of a parameter partition): even a source that evicts for
        whatever is needed now (``BufferSource.bypass`` False) keeps a held entry needed sooner, and the newcomer
        goes through a transient buffer to its file (helper-189: each update's writes rotated the held partitions,
        and the next forward read one back, behind a write)."""
        self._transfers.reap_writes()
        self._bypassing = False  # set where every victim was needed sooner (counted once, if it ends transient)
        while True:
            buffer = self._source.try_acquire(nbytes)
            if buffer is not None:
                return buffer, self._source.keeps(buffer)
            if self._gave_up_own_prefix(nbytes, incoming):
                continue
            victim = self._choose_victim(nbytes, incoming, use_pending, needed_now)
            if victim is not None:
                if victim.state == S.CLEAN:
                    self._transfers.drop(victim, S.ON_FILE)
                else:
                    self._transfers.start_write(victim, evicting=True)
                    self._counters.waits_for_slots += 1
                    self._transfers.wait_write(victim)
                # a write that failed raised above, or (reaped by another thread while this one waited) left the
                # victim DIRTY, its buffer still held: no eviction then
                self._counters.evictions += victim.state != S.DIRTY
                continue
            pending = self._evicting_write(nbytes)
            if pending is not None:
                self._counters.waits_for_slots += 1
                self._transfers.wait_write(pending)
                continue
            if self._waited_for_transient_room(nbytes):
                continue
            self._counters.transient_buffers += 1
            self._counters.bypassed += self._bypassing
            return self._source.fallback(nbytes), False

    def _gave_up_own_prefix(self, nbytes: int, incoming) -> bool:
        """The incoming entry's own prefix and the spare room together hold it whole (the budget grew, e.g. to all
        of the state): its prefix goes (written first if dirty), so that the whole tensor is kept rather than
        streamed through a slot beside its own prefix. The read that follows brings those bytes back."""
        entry = self._table.get(incoming)
        if entry is None or entry.prefix is None or self._source.room_needed(nbytes) > entry.prefix.capacity_bytes:
            return False
        self._transfers.write_prefix(entry)
        self._transfers.drop_prefix(entry)
        return True

    def acquire_transient(self, nbytes: int) -> Tuple[HostBuffer, bool]:
        """(buffer, False): a buffer for one use only, taking no held entry's room and no budget: a streaming slot
        (waiting for a write that frees one when all are taken), else fresh memory."""
        self._transfers.reap_writes()
        while self._waited_for_transient_room(nbytes):
            pass
        self._counters.transient_buffers += 1
        return self._source.fallback(nbytes), False

    def _waited_for_transient_room(self, nbytes: int) -> bool:
        """Every streaming slot is taken: wait for a write that gives one back rather than map new memory (True
        if one was waited for). Each extra mapping is a sub-group tensor (hundreds of MB for a large model) that
        raises the step's memory rise, and the host governor keeps that rise free by giving up cached tensors."""
        if self._source.transient_available(nbytes):
            return False
        freeing = next((entry for entry in self._table.writing()
                        if self._source.frees_transient_room_for(entry.buffer, nbytes)), None)
        if freeing is None:
            return False
        self._counters.waits_for_slots += 1
        self._transfers.wait_write(freeing)
        return True

    def _choose_victim(self, nbytes: int, incoming, use_pending: bool, needed_now: bool = True) -> Optional[Entry]:
        fitting = self._copies_elsewhere_first(
            entry.key for entry in self._table.held() if self._source.frees_room_for(entry.buffer, nbytes))
        if not fitting:
            return None
        if self._freeable_bytes(fitting, nbytes, incoming) < self._source.room_needed(nbytes):
            return None  # evicting every one would not make the room: the newcomer goes transient, they stay
        position = self._recorder.position
        index = self._index()
        bypass = self._source.bypass or not needed_now
        if not (bypass and index is not None and incoming in index):
            return self._table[choose_victim(fitting, index, position)]
        # All the room the newcomer needs, from victims each needed later than keeping it pays off, or none: a
        # victim evicted before the next one turns out not worth it would be a write (or a read) for nothing. The
        # first victim goes now; the caller asks again, and the rest follow in the same order.
        victims = victims_for(self._source.room_needed(nbytes), farthest_first(fitting, index, position),
                              lambda key: self._table[key].buffer.capacity_bytes, index, position,
                              kept_until(index, incoming, position, use_pending))
        if not victims:
            self._bypassing = True
            return None
        return self._table[victims[0]]

    def _freeable_bytes(self, fitting, nbytes: int, incoming) -> int:
        """The room evictions could make for ``incoming``: the held buffers that fit, the evicting writes in flight
        that do, and its own prefix (given up once the rest is made: ``_gave_up_own_prefix``). Less than it needs
        (a budget smaller than the tensor, other tensors' prefixes holding the rest), every held buffer was given up
        before the newcomer went transient anyway, written where dirty and read again at its next use (helper-189:
        the optimizer store with no profile yet, or off it)."""
        held = sum(self._table[key].buffer.capacity_bytes for key in fitting)
        writing = sum(entry.buffer.capacity_bytes for entry in self._table.writing()
                      if entry.evicting and self._source.frees_room_for(entry.buffer, nbytes))
        entry = self._table.get(incoming)
        own_prefix = entry.prefix.capacity_bytes if entry is not None and entry.prefix is not None else 0
        return held + writing + own_prefix

    def eviction_in_flight(self, nbytes: int) -> bool:
        """Is a held buffer that fits ``nbytes`` being written out to be given up (an eviction in flight)?"""
        return self._evicting_write(nbytes) is not None

    def _evicting_write(self, nbytes: int) -> Optional[Entry]:
        return next((entry for entry in self._table.writing()
                     if entry.evicting and self._source.frees_room_for(entry.buffer, nbytes)), None)

    def victim_for_read_ahead(self, nbytes: int, incoming) -> Optional[Entry]:
        """A held entry whose buffer a read ahead of ``incoming`` may have: of the buffer class the read needs, the
        one used farthest in the profiled order, provided that is after ``incoming``'s own use (Belady: the read
        that use would make on demand evicts that same entry then; reading ahead only moves that eviction earlier,
        to a moment the entry is not needed before). None while the order is unknown. Unchanged (CLEAN), its
        buffer goes at once; changed (DIRTY), its write has to end first, which the caller starts and does not
        wait for. Why: where every slot holds a cached partition (a host cache smaller than the partitions a step
        reads: gpt2-2.7b beyond RAM), a read ahead that may take no held buffer never started, and in the forward
        pass each read waited at its use behind the write of the partition it evicted, while the drive idled a
        third of the time."""
        index = self._index()
        if index is None or incoming not in index:
            return None
        fitting = [entry.key for entry in self._table.held() if self._source.frees_room_for(entry.buffer, nbytes)]
        if not fitting:
            return None
        position = self._recorder.position
        victim = choose_victim(fitting, index, position)
        if not worth_evicting(index.distance(victim, position), index.distance(incoming, position)):
            return None
        return self._table[victim]

    def grant_prefix(self, entry: Entry) -> None:
        """Before ``entry``'s transient buffer is written out: let the room whole tensors leave in the budget hold
        its first bytes from now on (the write then copies them out and writes only the rest). Only spare room:
        nothing is evicted for a prefix, and whole tensors take the room first (a read asks for a whole buffer
        before its write asks for a prefix), so in a cyclic order the kept bytes stay the same from step to step."""
        if entry.prefix is not None or entry.copy_elsewhere or not self._source.holds_prefixes:
            return  # (a copy elsewhere serves its reads: a prefix would save only bytes of its write)
        nbytes = prefix_nbytes(self._source.spare_bytes(), self._transfers.swap_nbytes(entry.numel))
        if not nbytes:
            return
        buffer = self._source.try_acquire(nbytes)
        if buffer is not None:
            self._transfers.attach_prefix(entry, buffer, nbytes)

    def give_up_prefixes(self, nbytes: int) -> int:
        """Give back prefixes, farthest next use first, until ``nbytes`` are freed (fewer when there are not
        enough); dirty ones are written first. Returns the bytes freed."""
        holders = self._copies_elsewhere_first(entry.key for entry in self._table if entry.prefix is not None)
        freed = 0
        for key in farthest_first(holders, self._index(), self._recorder.position):
            if freed >= nbytes:
                break
            entry = self._table[key]
            self._transfers.write_prefix(entry)
            freed += entry.prefix.capacity_bytes
            self._transfers.drop_prefix(entry)
        return freed

    def evict_held(self, nbytes: int, may_give_back: Callable[[HostBuffer], bool]) -> int:
        """Evict held entries whose buffers ``may_give_back`` until at least ``nbytes`` of buffers are freed (fewer
        when there are not enough): farthest next use first; the dirty ones' writes run together and are waited
        for. Returns the bytes freed."""
        candidates = self._copies_elsewhere_first(
            entry.key for entry in self._table.held() if may_give_back(entry.buffer))
        victims, freed = [], 0
        for key in farthest_first(candidates, self._index(), self._recorder.position):
            if freed >= nbytes:
                break
            victims.append(self._table[key])
            freed += self._table[key].buffer.capacity_bytes
        started, error = [], None
        try:
            for victim in victims:
                if victim.state == S.CLEAN:
                    self._transfers.drop(victim, S.ON_FILE)
                    self._counters.evictions += 1
                else:
                    self._transfers.start_write(victim, evicting=True)
                    started.append(victim)
        finally:
            # every write started is waited for whatever another raised; a victim is evicted once its write
            # succeeded (one that failed stays DIRTY, its bytes held: cache/transfers.py)
            for victim in started:
                try:
                    self._transfers.wait_write(victim)
                except Exception as err:  # noqa: BLE001  (the first is raised once all were waited for)
                    error = error or err
                    continue
                self._counters.evictions += victim.state != S.DIRTY
        if error is not None:
            raise error
        return freed

    def trim_kept(self, target_bytes: int) -> int:
        """Keep at most ``target_bytes`` of buffers from now on: prefixes go first (the last bytes admitted), then
        held entries (``evict_held``); if that is not enough, lent entries and reads in flight are no longer kept and
        go when released, farthest next use first. Returns the kept bytes left."""
        self._transfers.reap_writes()
        excess = self.kept_bytes() - max(0, int(target_bytes))
        if excess > 0:
            excess -= self.give_up_prefixes(excess)
        # (a transient buffer held only for a failed write is not counted kept: not taken for one either)
        excess -= self.evict_held(excess, self._transfers.source.keeps)
        # reads in flight too (a sub-group's state read ahead in backward): skipped, they stayed over the new total
        lent = self._copies_elsewhere_first(entry.key for entry in self._table
                                            if (entry.state in LENT or entry.state == S.READING) and entry.kept)
        for key in farthest_first(lent, self._index(), self._recorder.position):
            if excess <= 0:
                break
            self._table[key].kept = False  # released into a write and a drop, not into the cache
            excess -= self._table[key].buffer.capacity_bytes
        return self.kept_bytes()

    def kept_bytes(self) -> int:
        """Bytes of buffers kept between uses (held now, or lent and to be held again at release), prefixes
        included; not a transient buffer held only for a failed write's bytes (``Transfers.keeps``): the budget
        never held it, and a trim would evict budgeted state to cover it (helper-171)."""
        return sum((entry.buffer.capacity_bytes if entry.buffer is not None and self._transfers.keeps(entry) else 0)
                   + (entry.prefix.capacity_bytes if entry.prefix is not None else 0) for entry in self._table)


class ExclusiveStore:
    """What a caller may do inside ``EntryStore.exclusive`` (the lock is held there: the store's own calls would
    wait for it forever)."""

    def __init__(self, table: EntryTable, transfers: Transfers, admission: Admission):
        self._table = table
        self._transfers = transfers
        self._admission = admission

    def idle(self) -> bool:
        """Nothing lent, in flight, or owed to its file: every entry is on file or a clean copy (the parameter
        store's arena slots hold no prefixes, so none can be dirty)."""
        return all(entry.state in (S.ON_FILE, S.CLEAN) and entry.external_read is None for entry in self._table)

    def drop_clean_copies(self) -> None:
        """Give back the buffers of clean copies (their files hold the same bytes)."""
        for entry in self._table.held():
            self._transfers.drop(entry, S.ON_FILE)

    def evict_held(self, nbytes: int, may_give_back: Callable[[HostBuffer], bool]) -> int:
        """Give back at least ``nbytes`` of held buffers, farthest next use first (cache/admission.py)."""
        return self._admission.evict_held(nbytes, may_give_back)

    def swap_nbytes_by_key(self) -> Dict[Hashable, int]:
        return {entry.key: self._transfers.swap_nbytes(entry.numel) for entry in self._table}
