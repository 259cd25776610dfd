"""Recording one training step's access order. Owns: cutting a stream of accesses into steps. Pure."""
from typing import Hashable, List, Optional


# A step longer than this is not a training step we can learn from (inference or generation never ends one):
# stop recording rather than grow without bound. About 8 MB of list; models have thousands of tensors.
MAX_STEP_ACCESSES = 1_000_000


class StepRecorder:
    """``touch(key)`` for every access; ``end_step()`` returns the finished step's order (None if empty or too
    long) and starts the next. ``position`` is the index of the next access within the current step."""

    def __init__(self):
        self._current: List[Hashable] = []
        self._position = 0

    @property
    def position(self) -> int:
        return self._position

    def touch(self, key: Hashable) -> None:
        self._position += 1
        if self._position <= MAX_STEP_ACCESSES:
            self._current.append(key)
        else:
            self._current = []

    def end_step(self) -> Optional[List[Hashable]]:
        order, complete = self._current, self._position <= MAX_STEP_ACCESSES
        self._current, self._position = [], 0
        return order if order and complete else None
