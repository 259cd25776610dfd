"""The life of one cached tensor: where its newest bytes are, as an explicit state machine. Owns: the states, the
table of legal transitions, and the invariants every store checks (cache/tensor_store.py for parameter
partitions, cache/optimizer_store.py for optimizer state). Pure: no I/O, no torch.

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
"""
import enum
from typing import Dict, FrozenSet


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
