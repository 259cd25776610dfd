"""Which tensors a host tier of a given size keeps, step after step. Owns: replaying a repeating access sequence
through a byte budget under the store's policy (plan/eviction.py, the rules cache/entry_store.py applies: Belady
eviction over the profiled order, and no admission when every possible victim is needed sooner than the newcomer).
Pure.

It replays demand reads. The optimizer store reads each sub-group ahead of its use and decides then, by the use
after the one the read serves (plan/eviction.kept_until), which is the choice a demand read makes at that use; where
reads ahead overlap an eviction's own timing the two can differ, and nothing tests them against each other. It
counts bytes, not slots: the parameter store's arena has a slot per size class, so it may keep a little less than
predicted here. Used by `tencache-ds plan` and to tell the prefetch planner which accesses read NVMe.

With ``prefixes`` (the optimizer's store: cache/admission.py ``grant_prefix``) the room the kept tensors leave holds
the first bytes of tensors that stream, granted in the order they first miss and kept from then on: their accesses
still read NVMe, that many bytes fewer each way. The store grants them to the first tensors written out from a
transient buffer (at start-up, the masters as they are created), so with sub-groups of unequal sizes the two may
give the same room to different tensors, and whole granules of different sizes: the bytes agree to a granule per
prefix.
"""
import dataclasses
from typing import AbstractSet, Dict, FrozenSet, Hashable, Mapping, Sequence, Set

from ..profile.next_use import NextUseIndex
from .eviction import CopiesElsewhere, farthest_first, prefix_nbytes, victims_for


@dataclasses.dataclass(frozen=True)
class Residency:
    """One step in steady state: ``misses`` (positions that read NVMe), ``held`` (keys every access of which
    is a hit: they stay in the tier) and ``prefixes`` (bytes at the start of a missing key that the tier holds: its
    reads and writes move that many fewer)."""

    misses: FrozenSet[int]
    held: FrozenSet[Hashable]
    prefixes: Mapping[Hashable, int] = dataclasses.field(default_factory=dict)

    def read_bytes(self, nbytes: Sequence[int], keys: Sequence[Hashable] = ()) -> int:
        """NVMe bytes the misses read, ``nbytes`` per position (less the prefixes, given the positions' ``keys``)."""
        return sum(nbytes[position] - (self.prefixes.get(keys[position], 0) if keys else 0)
                   for position in self.misses)


def steady_state(keys: Sequence[Hashable], tensor_nbytes: Dict[Hashable, int], capacity_bytes: int,
                 prefixes: bool = False, elsewhere: AbstractSet[Hashable] = frozenset(),
                 emptied_each_pass: bool = False) -> Residency:
    """Replay ``keys`` twice through ``capacity_bytes``; the second pass is the steady state. ``prefixes``: the
    room left holds prefixes of missing keys (module docstring). ``elsewhere``: keys whose uses a copy elsewhere
    serves (plan/eviction.CopiesElsewhere: kept only in room nothing else takes, and given no prefix). Their
    misses still count as misses here: whether one reads NVMe is the caller's to say. ``emptied_each_pass``:
    nothing is held when the sequence starts over (the device tier at each optimizer step, which makes its
    gathered copies stale), so only uses within one pass can hit.

    E.g. keys [a, b, c, a, b, c] of 1 byte each, capacity 2: Belady keeps a and b, c is read both times
    (misses {2, 5}); LRU would miss all six.
    """
    index = CopiesElsewhere(NextUseIndex(keys), elsewhere.__contains__)
    held: Dict[Hashable, int] = {}
    used = 0
    misses: Set[int] = set()
    hit_keys: Set[Hashable] = set()
    missed_keys: Set[Hashable] = set()
    for lap in range(2):
        if emptied_each_pass:
            held.clear()
            used = 0
        for position, key in enumerate(keys):
            after = position + 1  # the store asks with the recorder's position, just past this access
            if key in held:
                if lap:
                    hit_keys.add(key)
                continue
            if lap:
                misses.add(position)
                missed_keys.add(key)
            size = tensor_nbytes[key]
            if size > capacity_bytes:
                continue
            farthest = farthest_first(list(held), index, after)
            victims = victims_for(size - (capacity_bytes - used), farthest, held.__getitem__,
                                  index, after, index.distance(key, after))
            if victims is None:
                continue  # bypass: not kept, the victims stay
            for other in victims:
                used -= held.pop(other)
            held[key] = size
            used += size
    granted: Dict[Hashable, int] = {}
    for position in sorted(misses) if prefixes else ():
        key = keys[position]
        if key not in granted and key not in elsewhere:
            granted[key] = prefix_nbytes(capacity_bytes - used - sum(granted.values()), tensor_nbytes[key])
    return Residency(frozenset(misses), frozenset(hit_keys - missed_keys),
                     {key: nbytes for key, nbytes in granted.items() if nbytes})
