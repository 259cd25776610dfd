"""Which of the engines alive at once in one process (an actor and a critic) an object belongs to, where they would
share one file. Owns: the ordinals: 0 for the first alive, the lowest free one for the next; an owner that is done
(closed, destroyed) or garbage collected frees its own. Engines made one after another are each the first; engines
made together get the same ordinals in every run that makes them in the same order. What is named by them: the
swappers' profile sections (profiling.py), the per-step metrics files (reporting.py)."""
import threading
import weakref
from typing import Callable, Dict, Hashable, List, Optional


class LiveOrdinals:
    """``claim(key, owner)``: ``owner``'s ordinal among those that claimed ``key`` and are not done."""

    def __init__(self, is_done: Callable[[object], bool]):
        self._is_done = is_done
        self._owners: Dict[Hashable, List[Optional[weakref.ref]]] = {}  # key -> owner by ordinal (None: free)
        self._lock = threading.Lock()

    def claim(self, key: Hashable, owner) -> int:
        with self._lock:
            owners = self._owners.setdefault(key, [])
            for ordinal, ref in enumerate(owners):
                alive = ref() if ref is not None else None
                if alive is None or self._is_done(alive):
                    break
            else:
                ordinal = len(owners)
                owners.append(None)
            owners[ordinal] = weakref.ref(owner)
        return ordinal
