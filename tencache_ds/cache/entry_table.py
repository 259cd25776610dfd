"""Every entry of one store, indexed by state. Owns: the entries (cache/entry.py records), their transitions (each
checked against the table of legal ones), the indexes hot paths read instead of scanning (count per state, held
entries in least-recently-used order, writes in flight, entries away on file), and the store-wide invariants. Pure
bookkeeping: no I/O, no lock (the store's lock guards it).
"""
import collections
from typing import Callable, Dict, Hashable, Iterator, List, Optional

from .entry import CACHED, OWES_FILE, Entry, EntryState, check_entry, check_transition

S = EntryState
AWAY = frozenset({S.ON_FILE, S.WRITING})  # no buffer to lend: on file, or on its way there


class EntryTable:
    """The entries by key, and the indexes kept with every transition (``set``)."""

    def __init__(self):
        self._entries: Dict[Hashable, Entry] = {}
        self._count = collections.Counter()  # EntryState -> entries in it (no scans on hot paths)
        self._held: "collections.OrderedDict[Hashable, Entry]" = collections.OrderedDict()  # CACHED, LRU first
        self._writing: Dict[Hashable, Entry] = {}
        self._away: Dict[Hashable, Entry] = {}  # AWAY

    def get(self, key) -> Optional[Entry]:
        return self._entries.get(key)

    def __getitem__(self, key) -> Entry:
        return self._entries[key]

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries.values())

    def new(self, key, numel: int, path: str, state: EntryState) -> Entry:
        entry = Entry(key, numel, path, state)
        self._entries[key] = entry
        self._count[state] += 1
        if state in AWAY:
            self._away[key] = entry
        return entry

    def set(self, entry: Entry, new: EntryState) -> None:
        """Move ``entry`` to ``new`` (IllegalTransition if the table forbids it). An entry that becomes held is the
        most recently used one."""
        old = entry.state
        check_transition(entry.key, old, new)
        entry.state = new
        if new not in OWES_FILE:  # its file is current, or its bytes are given up: no failed write is pending
            entry.write_failed = False
        self._count[old] -= 1
        self._count[new] += 1
        if new in CACHED:
            self._held[entry.key] = entry
            self._held.move_to_end(entry.key)
        else:
            self._held.pop(entry.key, None)
        if new == S.WRITING:
            self._writing[entry.key] = entry
        else:
            self._writing.pop(entry.key, None)
        if new in AWAY:
            self._away[entry.key] = entry
        else:
            self._away.pop(entry.key, None)

    def remove(self, entry: Entry) -> None:
        self._held.pop(entry.key, None)
        self._writing.pop(entry.key, None)
        self._away.pop(entry.key, None)
        self._count[entry.state] -= 1
        del self._entries[entry.key]

    def count(self, *states: EntryState) -> int:
        return sum(self._count[state] for state in states)

    def held(self) -> List[Entry]:
        """Entries held between uses (clean or dirty copies), least recently used first."""
        return list(self._held.values())

    def writing(self) -> List[Entry]:
        return list(self._writing.values())

    def away_keys(self) -> Iterator[Hashable]:
        """Keys of the entries on file or being written there (no buffer to lend)."""
        return iter(self._away)

    def check(self, min_capacity: Callable[[Entry], int]) -> None:
        """Raise AssertionError if an index disagrees with the entries, or an entry with its state
        (cache/entry.py check_entry), or a buffer is smaller than ``min_capacity(entry)``."""
        counts = collections.Counter(entry.state for entry in self._entries.values())
        assert counts == +self._count, (dict(counts), dict(self._count))
        for key, entry in self._entries.items():
            check_entry(entry)
            assert (key in self._held) == (entry.state in CACHED), (key, entry.state, entry.kept)
            assert (key in self._writing) == (entry.state == S.WRITING), (key, entry.state)
            assert (key in self._away) == (entry.state in AWAY), (key, entry.state)
            if entry.buffer is not None:
                assert entry.buffer.capacity_bytes >= min_capacity(entry), key
