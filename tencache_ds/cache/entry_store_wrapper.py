"""A store built around an EntryStore rather than derived from it. Owns: forwarding the EntryStore calls a wrapper
names (``FORWARDED``) and the profiled order (``next_use``), so that the parameter and optimizer stores
(cache/tensor_store.py, cache/optimizer_store.py) keep the calls their users make while reaching into nothing of
the EntryStore but its public API.
"""
from typing import FrozenSet, Optional

from ..profile.next_use import NextUseIndex
from .entry_store import EntryStore


class EntryStoreWrapper:
    """``entries``: the wrapped EntryStore. A subclass lists in ``FORWARDED`` the EntryStore calls its users make
    on it; any other name the wrapper lacks is an AttributeError, as on any object."""

    FORWARDED: FrozenSet[str] = frozenset()

    def __init__(self, entries: EntryStore):
        self.entries = entries

    def __getattr__(self, name: str):
        # Only reached for names the wrapper does not have itself.
        if name in type(self).FORWARDED:
            return getattr(self.entries, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def next_use(self) -> Optional[NextUseIndex]:
        """The profiled order the store's eviction follows (set when a profile is loaded or a step ends)."""
        return self.entries.next_use

    @next_use.setter
    def next_use(self, index: Optional[NextUseIndex]) -> None:
        self.entries.next_use = index
