"""Next-use distances and Belady's choice, against a brute-force oracle on random cyclic traces."""
import math
import random

import pytest

from tencache_ds.plan.eviction import choose_victim
from tencache_ds.profile.next_use import NextUseIndex


def brute_force_distance(order, key, position):
    for step in range(2 * len(order)):
        if order[(position + step) % len(order)] == key:
            return step
    return math.inf


def test_documented_example():
    index = NextUseIndex(["a", "b", "c", "b", "a"])
    assert index.distance("a", 2) == 2
    assert index.distance("c", 3) == 4
    assert index.distance("z", 0) == math.inf


@pytest.mark.parametrize("seed", range(5))
def test_matches_brute_force(seed):
    rng = random.Random(seed)
    order = [rng.randrange(8) for _ in range(30)]
    index = NextUseIndex(order)
    for key in range(10):
        for position in range(len(order)):
            assert index.distance(key, position) == brute_force_distance(order, key, position)


def test_belady_beats_lru_on_a_cyclic_scan():
    """A cyclic scan over 4 keys with room for 3: LRU misses every time, Belady keeps 2 of every 3 hits."""
    order = ["a", "b", "c", "d"]

    def misses(policy_index):
        cache, misses_ = [], 0  # LRU order
        for _ in range(5):
            for position, key in enumerate(order):
                if key in cache:
                    cache.remove(key)
                else:
                    misses_ += 1
                    if len(cache) == 3:
                        cache.remove(choose_victim(cache, policy_index, position))
                cache.append(key)
        return misses_

    assert misses(None) == 20
    assert misses(NextUseIndex(order)) < 12
