"""When is a tensor needed next? Owns: distances in a recorded access order that repeats every training step.
Pure. With the future known, evicting the cached tensor whose next use is farthest away is optimal (Belady:
plan/eviction.py).

In profile/, the layer below plan/: the profile lifecycle builds one from a recorded step, and the planners (plan/)
and the stores (cache/) read it."""
import bisect
import math
from typing import Dict, Hashable, List, Sequence


class NextUseIndex:
    """Next-use distances in a cyclic order: position ``p`` of one step is followed by position 0 of the next.

    E.g. order [a, b, c, b, a] (forward a b c, backward b a): at position 2 (c), ``distance(a, 2)`` is 2
    (position 4), ``distance(c, 3)`` is 5 - 3 + 2 = 4 (c again at position 2 of the next step).
    """

    def __init__(self, order: Sequence[Hashable]):
        self.length = len(order)
        self._positions: Dict[Hashable, List[int]] = {}
        for position, key in enumerate(order):
            self._positions.setdefault(key, []).append(position)

    @classmethod
    def from_positions(cls, positions: Dict[Hashable, List[int]], length: int) -> "NextUseIndex":
        """An index where a key may be used several times at one position (e.g. all parameters of one module are
        used at that module's step): ``positions[key]`` lists the positions of its uses, ``length`` is the step's."""
        index = cls(())
        index.length = length
        index._positions = {key: sorted(set(uses)) for key, uses in positions.items()}
        return index

    def distance(self, key: Hashable, position: int) -> float:
        """Accesses from ``position`` until ``key`` is used again (0: used at ``position``); inf if never."""
        positions = self._positions.get(key)
        if not positions:
            return math.inf
        position %= max(self.length, 1)
        index = bisect.bisect_left(positions, position)
        if index < len(positions):
            return positions[index] - position
        return self.length - position + positions[0]

    def __contains__(self, key) -> bool:
        return key in self._positions
