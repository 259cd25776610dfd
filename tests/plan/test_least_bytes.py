"""plan/least_bytes.py: the fewest NVMe bytes per step for a budget, on cyclic sequences with known answers, on a
real profile file, and against brute force over every way to keep whole intervals (it must never be above it)."""
import itertools
import json
import random

import pytest

from tencache_ds.plan.least_bytes import (OPTIMIZER, PARAMS, LeastBytes, Use, intervals, least_bytes, pack_line,
                                          store_uses)
from tencache_ds.profile.step_profile import StepProfile
from tencache_ds.profile.store import read_sections, save_section


def step(keys, size=10, sizes=None):
    sizes = sizes or {}
    return StepProfile.untimed(keys, [sizes.get(key, size) for key in keys])


def test_a_cyclic_sequence_with_known_misses():
    """Scenario: parameters a, b, c of 10 bytes, each used once per step, in a 20-byte tier: two are kept, the
    third is read every step and its new bytes (the optimizer step changes them) written every step."""
    least = least_bytes(step(["a", "b", "c"]), PARAMS, 20)
    assert (least.read_bytes, least.write_bytes, least.total_bytes) == (10, 10, 20)
    assert (least.all_read_bytes, least.all_write_bytes) == (30, 30)
    # Nothing kept: everything moves; everything kept: nothing does.
    assert least_bytes(step(["a", "b", "c"]), PARAMS, 0).total_bytes == 60
    assert least_bytes(step(["a", "b", "c"]), PARAMS, 30).total_bytes == 0


def test_forward_then_backward_keeps_what_spans_the_fewest_gaps():
    """Scenario: a b c c b a (forward, backward), 10 bytes each, a 10-byte tier. The best a tier can do is keep c
    from its forward use to its backward use (one read saved) and a from its backward use over the optimizer step
    to its next forward use (a read and the write of its new bytes): 60 read + 30 written - (10 + 20) = 60."""
    least = least_bytes(step(["a", "b", "c", "c", "b", "a"]), PARAMS, 10)
    assert (least.all_read_bytes, least.all_write_bytes) == (60, 30)
    assert least.total_bytes == 60


def test_optimizer_uses_are_told_apart_by_their_file_names():
    """Scenario: the optimizer profile of two sub-groups as optimizer_swapper.py records it: each gradient written
    in backward, then per sub-group its master, two moments and its gradient read by the update."""
    keys = ["0_4_gradient_0_100.tensor.swp", "5_9_gradient_0_100.tensor.swp",
            "0_4.tensor.swp", "exp_avg-0_4.tensor.swp", "exp_avg_sq-0_4.tensor.swp", "0_4_gradient_0_100.tensor.swp",
            "5_9.tensor.swp", "exp_avg-5_9.tensor.swp", "exp_avg_sq-5_9.tensor.swp", "5_9_gradient_0_100.tensor.swp"]
    uses = store_uses(OPTIMIZER, keys)
    written, read_changed, read = Use(False, True), Use(True, True), Use(True, False)
    assert uses == [written, written, read_changed, read_changed, read_changed, read,
                    read_changed, read_changed, read_changed, read]
    # With nothing kept: every state is read and written once, every gradient written and read once.
    least = least_bytes(step(keys), OPTIMIZER, 0)
    assert (least.read_bytes, least.write_bytes) == (80, 80)
    # A gradient's bytes are dead after the update: keeping them until the next backward saves nothing, so a tier
    # of one tensor saves one tensor's read and write (any one of the eight), never more.
    assert least_bytes(step(keys), OPTIMIZER, 10).total_bytes == 160 - 20


def test_masters_filled_from_the_parameter_partitions_owe_neither_their_read_nor_their_write():
    """Scenario: the same two sub-groups, trained in fp32 with every parameter partition held, so each update fills
    its master from them (integrations/deepspeed/master_copies.py): the masters' 20 bytes of reads are not the
    drive's, and nor are their 20 bytes of writes (the partitions hold what the update leaves; the files are written
    only where something needs them: integrations/deepspeed/master_write_behind.py). A tier of one tensor then
    saves most by keeping a moment (a read and a write); keeping a master saves nothing."""
    keys = ["0_4_gradient_0_100.tensor.swp", "5_9_gradient_0_100.tensor.swp",
            "0_4.tensor.swp", "exp_avg-0_4.tensor.swp", "exp_avg_sq-0_4.tensor.swp", "0_4_gradient_0_100.tensor.swp",
            "5_9.tensor.swp", "exp_avg-5_9.tensor.swp", "exp_avg_sq-5_9.tensor.swp", "5_9_gradient_0_100.tensor.swp"]
    uses = store_uses(OPTIMIZER, keys, masters_in_partitions=True)
    assert [use.read_elsewhere for use in uses] == [False, False, True, False, False, False, True, False, False, False]
    least = least_bytes(step(keys), OPTIMIZER, 0, masters_in_partitions=True)
    assert (least.read_bytes, least.write_bytes) == (60, 60)
    assert (least.all_read_bytes, least.all_write_bytes) == (60, 60)
    assert least_bytes(step(keys), OPTIMIZER, 10, masters_in_partitions=True).total_bytes == 120 - 20
    assert least_bytes(step(keys), PARAMS, 0, masters_in_partitions=True) == least_bytes(step(keys), PARAMS, 0)


def test_the_bound_is_never_above_the_best_whole_interval_choice():
    """Property: on random small sequences, the bound is at most the fewest bytes of any choice of whole intervals
    that fits the budget at every gap (brute force): it is a lower bound."""
    generator = random.Random(7)
    for trial in range(60):
        keys = [generator.choice("abcd") for _ in range(generator.randint(2, 7))]
        sizes = {key: generator.randint(1, 6) for key in "abcd"}
        capacity = generator.randint(0, 12)
        section = PARAMS if trial % 2 else OPTIMIZER
        profile = step(keys, sizes=sizes)
        least = least_bytes(profile, section, capacity)
        assert least.total_bytes <= brute_force_least(profile, section, capacity), (keys, sizes, capacity)
        assert least.read_bytes <= least.all_read_bytes and least.write_bytes <= least.all_write_bytes


def brute_force_least(profile, section, capacity):
    found = intervals(profile, store_uses(section, profile.keys), changed_between_steps=section == PARAMS)
    n = len(profile.keys)
    best = None
    for keep in itertools.product((False, True), repeat=len(found)):
        load = [0] * n
        for kept, interval in zip(keep, found):
            if kept:
                for offset in range(interval.length):
                    load[(interval.start_gap + offset) % n] += interval.nbytes
        if max(load) > capacity:
            continue
        cost = sum(interval.nbytes * (interval.read_value + interval.write_value)
                   for kept, interval in zip(keep, found) if not kept)
        best = cost if best is None else min(best, cost)
    return best


def test_line_packing_matches_brute_force():
    """pack_line (earliest end first, each as far as the room allows) finds the most bytes on small lines."""
    generator = random.Random(3)
    for _ in range(80):
        line = []
        for _ in range(generator.randint(1, 4)):
            start = generator.randint(0, 4)
            line.append((start, start + generator.randint(1, 3), generator.randint(1, 3)))
        capacity = generator.randint(1, 5)
        best = 0
        for amounts in itertools.product(*(range(nbytes + 1) for _s, _e, nbytes in line)):
            load = [0] * 8
            for (start, end, _nbytes), amount in zip(line, amounts):
                for gap in range(start, end):
                    load[gap] += amount
            if max(load) <= capacity:
                best = max(best, sum(amounts))
        assert pack_line(line, 8, capacity) == best, (line, capacity)


def test_a_profile_file_round_trip_gives_the_same_bound(tmp_path):
    """Scenario: the bound read back from a real profile file (profile/store.py) equals the one from the step."""
    keys = ["0_4_gradient_0_100.tensor.swp", "0_4.tensor.swp", "exp_avg-0_4.tensor.swp",
            "exp_avg_sq-0_4.tensor.swp", "0_4_gradient_0_100.tensor.swp"]
    original = step(keys, size=4096)
    path = str(tmp_path / "profile.json")
    save_section(path, OPTIMIZER, "f" * 16, original)
    assert json.load(open(path))["sections"][OPTIMIZER]["step"]["keys"] == keys
    again = read_sections(path)[OPTIMIZER].step
    assert least_bytes(again, OPTIMIZER, 8192) == least_bytes(original, OPTIMIZER, 8192)
    assert isinstance(least_bytes(again, OPTIMIZER, 8192), LeastBytes)


@pytest.mark.parametrize("capacity", [0, 25, 40])
def test_sums_of_stores(capacity):
    both = least_bytes(step(["a", "b"]), PARAMS, capacity) + least_bytes(step(["c"]), PARAMS, capacity)
    assert both.capacity_bytes == 2 * capacity and both.all_read_bytes == 30


def test_walking_sub_groups_in_alternating_order_saves_no_bytes():
    """Issue 15's "cache-friendly sub-group order" (MLP-Offload: the update walks the sub-groups forward, then
    backward at the next step, so the last ones updated are the first needed) against the order stage 3 keeps.
    Scenario: n sub-groups of one optimizer tensor each (master and moments behave alike), each read and changed
    once per step by the update. Every interval between two uses of a tensor crosses a step boundary, in either
    order, and at that instant the tier holds at most its budget: so no order saves more than a budget's worth a
    step, and the fixed order already does (it keeps a fixed set). Alternating only helps a tier that evicts the
    least recently used, which the fixed order defeats; tencache's evicts by next use. Checked for the bound and,
    on a small case, for the best choice of whole intervals (brute force)."""
    def states(order):
        return [f"exp_avg-{group}.tensor.swp" for group in order]

    for n, size in ((5, 10), (37, 8), (26, 3)):
        fixed = step(states(range(n)) * 2, size=size)  # two steps, to compare with a period of two
        alternating = step(states(range(n)) + states(reversed(range(n))), size=size)
        for capacity in sorted({0, size, 3 * size + size // 2, n * size // 4, n * size // 2, n * size - 1}):
            assert least_bytes(alternating, OPTIMIZER, capacity) == least_bytes(fixed, OPTIMIZER, capacity), \
                (n, capacity)
    # The comparison tells orders apart where they matter: tensors used twice in a step, back to back or not.
    assert least_bytes(step(list("aabbcc")), OPTIMIZER, 10).total_bytes < \
        least_bytes(step(list("abcabc")), OPTIMIZER, 10).total_bytes
    small_fixed, small_alternating = step(states(range(4)) * 2, size=2), step(states([0, 1, 2, 3, 3, 2, 1, 0]), 2)
    for capacity in range(0, 9):
        assert brute_force_least(small_alternating, OPTIMIZER, capacity) == \
            brute_force_least(small_fixed, OPTIMIZER, capacity), capacity
