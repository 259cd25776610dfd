"""The device tier's policy: Belady admission/eviction under a byte budget, its budget rule, and its invariant."""
import itertools
import random

import pytest

from tencache_ds.plan.device_tier import DeviceTier, device_tier_budget
from tencache_ds.profile.next_use import NextUseIndex

# A 4-layer model's module steps: forward 0..3, backward 3..0 (the coordinator's trace), one param per layer.
LAYERS = ["l0", "l1", "l2", "l3"]
POSITIONS = {key: [i, 7 - i] for i, key in enumerate(LAYERS)}


def tier(budget):
    t = DeviceTier(budget)
    t.set_index(NextUseIndex.from_positions(POSITIONS, 8))
    return t


def always(_key):
    return True


def test_from_positions_collapses_uses_at_one_position():
    index = NextUseIndex.from_positions({"a": [2, 2, 5], "b": [0]}, 8)
    assert index.distance("a", 3) == 2
    assert index.distance("a", 6) == 8 - 6 + 2
    assert index.distance("b", 1) == 7


def test_keeps_everything_that_fits():
    t = tier(400)
    for position, key in enumerate(LAYERS, start=1):
        assert t.on_release(key, 100, position, always) == (True, [])
    assert t.resident_bytes == 400
    t.check()


def test_last_forward_layers_are_kept_for_the_backward():
    # Budget for two layers: releasing l2 and l3 after the forward, Belady keeps those used first in backward.
    t = tier(200)
    t.on_release("l0", 100, 1, always)
    t.on_release("l1", 100, 2, always)
    keep, victims = t.on_release("l2", 100, 3, always)
    assert keep and victims == ["l0"]  # l0 is used last (position 7)
    keep, victims = t.on_release("l3", 100, 4, always)
    assert keep and victims == ["l1"]
    assert sorted(t.resident_keys()) == ["l2", "l3"]
    t.check()


def test_a_smaller_budget_releases_the_residents_used_farthest_ahead_but_not_one_in_use():
    """Memory pressure where the device is host memory: the tier is refitted to the parameters' new share."""
    t = tier(400)
    for position, key in enumerate(LAYERS, start=1):
        t.on_release(key, 100, position, always)
    # at position 4 (backward starts with l3): l0 is used farthest ahead, then l1
    assert t.resize(200, 4, always) == ["l0", "l1"]
    assert sorted(t.resident_keys()) == ["l2", "l3"] and t.evicted == 2
    t.check()
    assert t.resize(0, 4, lambda key: key != "l3") == ["l2"]  # l3 is in use: it stays until released
    assert t.resident_keys() == ["l3"] and t.budget_bytes == 0
    t.forget("l3")
    t.check()
    assert t.resize(400, 4, always) == [] and t.budget_bytes == 400  # memory back: nothing to release


def test_newcomer_used_later_than_all_residents_is_not_kept():
    t = tier(200)
    t.on_release("l2", 100, 3, always)
    t.on_release("l3", 100, 4, always)
    # at position 4, l1 is next used at 6: later than l3 (4) and l2 (5)
    assert t.on_release("l1", 100, 4, always) == (False, [])
    assert sorted(t.resident_keys()) == ["l2", "l3"]


def test_a_resident_in_use_is_never_a_victim():
    t = tier(200)
    t.on_release("l0", 100, 1, always)
    t.on_release("l1", 100, 2, always)
    keep, victims = t.on_release("l2", 100, 3, lambda key: key != "l0")
    assert keep and victims == ["l1"]
    assert "l0" in t


def test_without_an_index_nothing_is_evicted_and_newcomers_fill_free_room():
    """Scenario: the live sequence leaves the trace (an eval pass between training steps). Parameters are current
    until the optimizer step, and the eval pass and the re-traced step use the same ones: residents stay, and a
    parameter gathered for the eval pass is kept while it fits (no victim: nothing says what is needed next)."""
    # Step 1: two residents, then the index goes away, in a tier with room for three.
    t = tier(300)
    t.on_release("l0", 100, 1, always)
    t.on_release("l1", 100, 2, always)
    t.set_index(None)
    # Step 2: the eval pass releases l0 after using it: it stays; l2 is new and fits; l3 finds no room.
    assert t.on_release("l0", 100, 5, always) == (True, [])
    assert t.on_release("l2", 100, 6, always) == (True, [])
    assert t.on_release("l3", 100, 7, always) == (False, [])
    assert sorted(t.resident_keys()) == ["l0", "l1", "l2"] and t.resident_bytes == 300
    # Step 3: a new trace, in which l0 is never used again and l3 is: l0 is the first to make room.
    t.set_index(NextUseIndex.from_positions({"l1": [0], "l2": [1], "l3": [2]}, 8))
    keep, victims = t.on_release("l3", 100, 0, always)
    assert keep and victims == ["l0"]
    # Step 4: draining (the optimizer step, a checkpoint) hands every resident back.
    assert sorted(t.drain()) == ["l1", "l2", "l3"] and t.resident_bytes == 0
    t.check()


def test_unknown_key_and_oversized_key_are_not_kept():
    t = tier(1000)
    assert t.on_release("not-in-profile", 10, 0, always) == (False, [])
    assert t.on_release("l0", 2000, 1, always) == (False, [])
    assert t.resident_bytes == 0


def test_zero_budget_is_demand_fetching():
    t = tier(0)
    assert all(t.on_release(key, 1, 1, always) == (False, []) for key in LAYERS)


def test_the_peak_is_what_the_step_held_though_the_update_empties_the_tier():
    """On a GPU the tier holds parameters from their first use to the optimizer step, which releases them all (the
    update makes them stale): at the step's end it holds 0 B, and only the peak says what it held during the step."""
    t = tier(400)
    for position, key in enumerate(LAYERS[:3], start=1):
        t.on_release(key, 100, position, always)
    t.forget("l0")
    assert (t.resident_bytes, t.peak_resident_bytes) == (200, 300)
    t.drain()  # the optimizer step
    assert (t.resident_bytes, t.peak_resident_bytes) == (0, 300)
    t.check()
    t.restart_peak()  # the next step's
    assert t.peak_resident_bytes == 0
    t.on_release("l3", 100, 4, always)
    assert t.peak_resident_bytes == 100
    t.check()


def test_invariant_holds_under_random_releases():
    rng = random.Random(7)
    keys = [f"p{i}" for i in range(30)]
    length = 60
    positions = {key: sorted(rng.sample(range(length), 3)) for key in keys}
    sizes = {key: rng.randint(1, 50) for key in keys}
    t = DeviceTier(200)
    t.set_index(NextUseIndex.from_positions(positions, length))
    resident = set()
    for step, key in zip(itertools.count(), (rng.choice(keys) for _ in range(2000))):
        busy = set(rng.sample(keys, 3))
        keep, victims = t.on_release(key, sizes[key], step % length, lambda k: k not in busy)
        assert not (set(victims) & busy)
        resident -= set(victims)
        resident.discard(key)
        if keep:
            resident.add(key)
        assert set(t.resident_keys()) == resident
        t.check()


@pytest.mark.parametrize("configured, aliases, share, free, resident, rise, expected", [
    ("auto", True, 500, 0, 0, 0, 500),       # CPU accelerator, one rank: the params' host-cache share, counted once
    (300, True, 500, 0, 0, 0, 300),          # a configured size within the share
    (900, True, 500, 0, 0, 0, 500),          # ... capped by it: never more host memory than the host tier's
    ("auto", False, 500, 1000, 0, 0, 500),   # own memory (GPU, or CPU ranks' all-gather output): part of what is free
    ("auto", False, 500, 600, 400, 0, 500),  # ... counting what the tier holds already (it is the tier's)
    ("auto", False, 500, 600, 400, 700, 300),  # ... leaving a step's activation rise free
    ("auto", False, 500, 100, 0, 700, 0),    # ... and nothing when the step needs it all
    (0, False, 500, 1000, 0, 0, 0),          # off
    (2000, False, 500, 1000, 0, 0, 2000),    # a configured size is the user's to choose
])
def test_budget_rule(configured, aliases, share, free, resident, rise, expected):
    assert device_tier_budget(configured, aliases, share, free, auto_fraction=0.5, resident_bytes=resident,
                              step_peak_rise_bytes=rise) == expected
