"""Belady eviction, one policy for every tier. Owns: which held tensor gives its room up (the one needed farthest
ahead; least recently used while the order is unknown), when making room is not worth it (bypass: every possible
victim is needed sooner than the newcomer), and how far ahead a read ahead counts its newcomer as needed (the use
after the one the read serves), how large a prefix spare room holds (finer than a whole tensor: the first bytes
of one that streams, cache/entry.py), and how a tensor whose next use a copy elsewhere serves counts
(``CopiesElsewhere``). Pure: keys, sizes and next-use distances (profile/next_use.py).

Served to: the host tier's store (cache/entry_store.py) and its planner (plan/host_residency.py, which replays the
store's choices; tests/plan/test_eviction.py checks that both miss the same accesses), and the device tier
(plan/device_tier.py).
"""
import math
from typing import Callable, Hashable, List, Optional, Sequence, Tuple, Union

from ..profile.next_use import NextUseIndex

# A prefix's size is a multiple of this (any O_DIRECT alignment divides it), and no prefix is smaller: below it the
# copy and the second request per read and write cost more than the bytes save.
PREFIX_GRANULE_BYTES = 1 << 20


class CopiesElsewhere:
    """Next-use distances for a tier some of whose tensors have a current copy elsewhere (``elsewhere(key)``: the
    fp32 masters that the parameter partitions hold, which an update fills its master from instead of reading it:
    integrations/deepspeed/master_copies.py). Such a tensor's next use reads nothing, kept or not, so keeping its
    buffer saves only its write where keeping any other tensor saves a read and a write: it counts as never needed
    again. The rules below, unchanged, then take its room first and evict nothing to keep it.

    E.g. a cyclic order of three sub-groups' master, moment and moment (p0 m0 v0 p1 m1 v1 p2 m2 v2), room for two:
    on next use alone the tier would keep p0 and m0, saving m0's read and both writes; with p0..p2 elsewhere it
    keeps two moments, saving two reads and two writes.

    Among themselves such tensors go in the order of their next use (``farness``), not in the order they happen to
    be held, so that the planner (plan/host_residency.py) and the store, which hold them in different orders,
    choose the same."""

    def __init__(self, index: NextUseIndex, elsewhere: Callable[[Hashable], bool]):
        self.index = index
        self.elsewhere = elsewhere

    def distance(self, key: Hashable, position: int) -> float:
        return math.inf if self.elsewhere(key) else self.index.distance(key, position)

    def farness(self, key: Hashable, position: int) -> Tuple[float, float]:
        return self.distance(key, position), self.index.distance(key, position)

    def __contains__(self, key) -> bool:
        return key in self.index


Index = Union[NextUseIndex, CopiesElsewhere]


def _farness(index: Index, key: Hashable, position: int):
    return index.farness(key, position) if isinstance(index, CopiesElsewhere) else index.distance(key, position)


def choose_victim(candidates: Sequence[Hashable], index: Optional[Index], position: int) -> Hashable:
    """The candidate to evict: the one used farthest in the future (Belady) when ``index`` knows the order, the
    first (least recently used, callers pass LRU order) otherwise or on ties."""
    if index is None:
        return candidates[0]
    return max(candidates, key=lambda key: _farness(index, key, position))  # max keeps the first on ties


def farthest_first(candidates: Sequence[Hashable], index: Optional[Index], position: int) -> List[Hashable]:
    """``candidates`` in the order ``choose_victim`` would take them one by one: farthest next use first (ties in
    the given order: sorting is stable), or the given (LRU) order while ``index`` is None."""
    if index is None:
        return list(candidates)
    return sorted(candidates, key=lambda key: _farness(index, key, position), reverse=True)


def worth_evicting(victim_next_use: float, incoming_next_use: float) -> bool:
    """Belady's rule for making room: evict the victim for the incoming tensor (a prefetch, or a read to keep)
    only if the victim is needed later. Distances in accesses (NextUseIndex.distance; inf: never again). E.g.
    victim next used in 12 accesses, prefetch target in 3: evict and issue. Victim in 2: do not issue."""
    return victim_next_use > incoming_next_use


def victims_for(needed_bytes: int, farthest: Sequence[Hashable], nbytes: Callable[[Hashable], int],
                index: NextUseIndex, position: int, incoming_next_use: float) -> Optional[List[Hashable]]:
    """Whom to evict for ``needed_bytes`` more room: from ``farthest`` (candidates, farthest next use first), as
    long as each is ``worth_evicting`` for the newcomer. None when those cannot free enough: the newcomer is not
    admitted (bypass) and nothing is evicted. E.g. need 2 bytes, candidates x (next use 9, 1 byte) and y (next use
    4, 1 byte), newcomer used in 5: x is worth it, y is not: None."""
    victims: List[Hashable] = []
    for candidate in farthest:
        if needed_bytes <= 0 or not worth_evicting(index.distance(candidate, position), incoming_next_use):
            break
        victims.append(candidate)
        needed_bytes -= nbytes(candidate)
    return None if needed_bytes > 0 else victims


def kept_until(index: NextUseIndex, key: Hashable, position: int, use_pending: bool) -> float:
    """Accesses from ``position`` until keeping ``key``'s buffer pays off: its next use; for a prefetch, whose use
    is still ahead and served by this read anyway, the use after that one. (Measured from the prefetch's own
    position instead, every read ahead would look needed sooner than anything held and evict what was just
    used: a held set that rotates, each admission paid for with a write.)"""
    distance = index.distance(key, position)
    if use_pending:
        distance += 1 + index.distance(key, position + distance + 1)
    return distance


def prefix_nbytes(spare_bytes: int, tensor_nbytes: int) -> int:
    """The prefix ``spare_bytes`` of room hold of a tensor of ``tensor_nbytes`` that streams: whole granules,
    leaving at least one for the file (a prefix never covers a whole tensor: that is a held entry); 0 when not even
    one granule fits. E.g. 2.5 granules spare, a tensor of 10: 2 granules; of 2: 1 granule."""
    nbytes = min(spare_bytes, tensor_nbytes - PREFIX_GRANULE_BYTES)
    nbytes -= nbytes % PREFIX_GRANULE_BYTES
    return nbytes if nbytes >= PREFIX_GRANULE_BYTES else 0
