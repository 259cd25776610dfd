"""The life of one cached tensor: where its newest bytes are, as an explicit state machine. Owns: the states, the
table of legal transitions, the record of one tensor (``Entry``: its state and every fact a store keeps about it
beside the state) and the invariants that tie them (``check_entry``), which every store checks
(cache/entry_store.py; cache/tensor_store.py for parameter partitions, cache/optimizer_store.py for optimizer
state). Pure: no I/O, no torch.

A tensor's newest bytes are on file, in a host buffer, or both:

    ON_FILE --start read--> READING --read done--> LENT_CLEAN --release--> CLEAN --evict--> ON_FILE
                               |                       |                     |  ^
                         read failed                changed                 hit  write done (flush)
                               v                       v                     v  |
                            ON_FILE                LENT_DIRTY --release--> DIRTY --evict/flush--> WRITING
                                                                                                    |
                                                             write done (evict): ON_FILE; failed: DIRTY

- ON_FILE: no buffer; the file holds the newest bytes.
- READING: a read from file into the entry's buffer is in flight.
- LENT_CLEAN / LENT_DIRTY: the buffer is lent to DeepSpeed (a swap-in handed it out, no copy); the file does /
  does not hold the same bytes.
- CLEAN / DIRTY: the buffer is held in host memory between uses (a cached copy); file current / stale.
- WRITING: the buffer's bytes are being written to file; the buffer is not lent and not changed meanwhile.

Write-back: new bytes make an entry DIRTY; they reach the file only when the entry is evicted or flushed (a
checkpoint, close). A failed write leaves the entry DIRTY (the bytes are not lost, the error is raised); a failed
read leaves it ON_FILE (partial bytes are never served).

A prefix (finer than a whole tensor): an entry whose whole buffer is not kept may hold its first ``prefix_nbytes``
bytes in a budgeted buffer of their own between uses, beside the state above (a budget smaller than one tensor
still saves bytes). Its reads copy the prefix in and read only the rest of the file; its writes copy the prefix
out and write only the rest (``prefix_dirty``: the prefix is newer than the file's first bytes, written at a flush
or when the prefix is given up). A kept whole buffer makes the prefix redundant: it is folded in when the read that
fills the buffer is done (READING is the one state with both), or dropped when new bytes replace the whole tensor.
"""
import dataclasses
import enum
from concurrent.futures import Future
from typing import Any, Dict, FrozenSet, Hashable, Optional


class EntryState(enum.Enum):
    ON_FILE = "on_file"
    READING = "reading"
    LENT_CLEAN = "lent_clean"
    LENT_DIRTY = "lent_dirty"
    CLEAN = "clean"
    DIRTY = "dirty"
    WRITING = "writing"


S = EntryState
LEGAL_TRANSITIONS: Dict[EntryState, FrozenSet[EntryState]] = {
    S.ON_FILE: frozenset({S.READING,      # miss: read into a buffer
                          S.LENT_DIRTY,   # a new tensor's first bytes (or bytes replaced whole) are handed out
                          S.DIRTY}),      # new bytes stored without a read (write-back)
    S.READING: frozenset({S.LENT_CLEAN,   # read done, handed out
                          S.ON_FILE}),    # read failed: buffer dropped
    S.LENT_CLEAN: frozenset({S.CLEAN,     # released, kept as a cached copy
                             S.ON_FILE,   # released, buffer dropped
                             S.LENT_DIRTY}),  # the borrower changed the bytes
    S.LENT_DIRTY: frozenset({S.DIRTY,     # released, kept (write-back)
                             S.WRITING}),  # released, no room to keep it: write, then drop
    S.CLEAN: frozenset({S.LENT_CLEAN,     # hit
                        S.ON_FILE,        # evicted (nothing to write)
                        S.DIRTY,          # new bytes stored into the cached buffer
                        S.LENT_DIRTY}),   # bytes replaced whole while handed out
    S.DIRTY: frozenset({S.LENT_DIRTY,     # hit
                        S.WRITING,        # evicted or flushed
                        S.DIRTY}),        # new bytes again (still not written)
    S.WRITING: frozenset({S.CLEAN,        # flush done: the copy stays
                          S.ON_FILE,      # eviction done: buffer dropped
                          S.DIRTY}),      # write failed: the bytes stay, owed to the file
}

HOLDS_BUFFER = frozenset(set(EntryState) - {S.ON_FILE})
LENT = frozenset({S.LENT_CLEAN, S.LENT_DIRTY})
CACHED = frozenset({S.CLEAN, S.DIRTY})           # held between uses: candidates for eviction
OWES_FILE = frozenset({S.LENT_DIRTY, S.DIRTY, S.WRITING})  # the file lacks the newest bytes
IO_IN_FLIGHT = frozenset({S.READING, S.WRITING})


class IllegalTransition(RuntimeError):
    """A store tried a transition the table does not allow: a bug in tencache, never a user error."""


def check_transition(key, old: EntryState, new: EntryState) -> None:
    if new not in LEGAL_TRANSITIONS[old]:
        raise IllegalTransition(f"entry {key!r}: {old.value} -> {new.value} is not a legal transition")


def lent_state(state: EntryState) -> EntryState:
    """The lent state a cached entry of ``state`` takes when handed out."""
    return S.LENT_DIRTY if state in OWES_FILE else S.LENT_CLEAN


def released(state: EntryState) -> EntryState:
    """The cached state a lent entry returns to."""
    return S.DIRTY if state == S.LENT_DIRTY else S.CLEAN


@dataclasses.dataclass
class PendingUse:
    """The use of a read ahead, recorded when it comes (``wait_read``): reading ahead never changes the recorded
    order. ``issued_at`` / ``done_at``: clock times of its read (``issued_at`` None: no read, it was a hit)."""

    issued_at: Optional[float] = None
    done_at: Optional[float] = None  # set by the read's done-callback: one attribute, atomic under the GIL


@dataclasses.dataclass(eq=False)
class Entry:
    """One swapped tensor: its state and what a store keeps about it beside the state (``check_entry`` ties them
    together)."""

    key: Hashable
    numel: int
    path: str
    state: EntryState = S.ON_FILE
    buffer: Optional[Any] = None  # a memory/pool.py HostBuffer, in every state but ON_FILE
    io: Optional[Future] = None   # the read or write in flight (READING, WRITING)
    kept: bool = False            # the buffer may stay after use (else it goes back once the bytes are safe)
    evicting: bool = False        # WRITING: the buffer goes when the write is done (else the entry stays CLEAN)
    write_failed: bool = False    # its last write failed (its bytes kept, owed): until its file is current again
    staged: bool = False          # the buffer is a one-time staging buffer (lend_new(staging=True))
    # A read of the file into the caller's own buffer (start_read(into=...)), not waited for yet; the entry's state
    # is not changed by it (its bytes stay where they were).
    external_read: Optional[Future] = None
    prefetched: bool = False      # a read ahead of its use, not waited for yet (late if wait_read has to wait)
    pending_use: Optional[PendingUse] = None  # a read ahead (or a hit ahead) whose use is still to be recorded
    prefix: Optional[Any] = None  # a budgeted HostBuffer holding the first prefix_nbytes bytes (module docstring)
    prefix_nbytes: int = 0
    prefix_dirty: bool = False    # the prefix is newer than the file's first prefix_nbytes bytes
    # The borrower's last release said a current copy of these bytes is kept elsewhere, so the next use reads
    # nothing (plan/eviction.CopiesElsewhere): the buffer yields its room first, and no prefix is granted to it
    # (one it holds goes when a release writes it whole). Only a hint for the policy, possibly stale by the next use:
    # whether a lend is served from the copy is decided there (EntryStore.lend_copied's caller).
    copy_elsewhere: bool = False


def check_entry(entry: Entry) -> None:
    """Raise AssertionError if ``entry``'s fields contradict its state."""
    key, state = entry.key, entry.state
    assert (entry.buffer is not None) == (state in HOLDS_BUFFER), (key, state)
    assert (entry.io is not None) == (state in IO_IN_FLIGHT), (key, state)
    if state in CACHED:
        assert entry.kept, (key, "a buffer that may not be kept is held between uses")
    assert entry.buffer is not None or not (entry.kept or entry.staged), (key, "kept or staged without a buffer")
    assert not entry.evicting or state == S.WRITING, (key, state, "evicting without a write in flight")
    assert not entry.write_failed or state in OWES_FILE, (key, state, "a failed write pending on a current file")
    being_used = state in LENT or state == S.READING  # lent, or read into our buffer for a use
    assert entry.external_read is None or not being_used, (key, state, "read into the caller's buffer and ours")
    if entry.prefetched:  # its read is in flight or done, not yet waited for
        assert state == S.READING or entry.external_read is not None, (key, state, "prefetched without a read")
    if entry.pending_use is not None:  # handed out ahead of its use, or being read for it
        assert being_used or entry.external_read is not None, (key, state, "a pending use with nothing for it")
    if entry.prefix is None:
        assert entry.prefix_nbytes == 0 and not entry.prefix_dirty, (key, "prefix bytes without a prefix buffer")
    else:
        assert 0 < entry.prefix_nbytes <= entry.prefix.capacity_bytes, (key, entry.prefix_nbytes)
        assert state == S.READING or not (entry.buffer is not None and entry.kept), (
            key, state, "a prefix beside a kept whole buffer")
