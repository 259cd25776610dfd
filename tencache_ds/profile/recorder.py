"""Recording one training step's access order. Owns: cutting a stream of accesses into steps. Pure."""
from typing import Hashable, List, Optional


class StepRecorder:
    """``touch(key)`` for every access; ``end_step()`` returns the finished step's order (None if empty) and
    starts the next. ``position`` is the index of the next access within the current step."""

    def __init__(self):
        self._current: List[Hashable] = []

    @property
    def position(self) -> int:
        return len(self._current)

    def touch(self, key: Hashable) -> None:
        self._current.append(key)

    def end_step(self) -> Optional[List[Hashable]]:
        order, self._current = self._current, []
        return order or None
