"""The optimizer store's host footprint (cache/optimizer_store.py): the budget for kept state beside the streaming
slots, and the slot an update lends even when everything is kept (a gradient filled from DeepSpeed's buffer)."""
import pytest
import torch

from tencache_ds.cache.entry import EntryState
from tencache_ds.cache.optimizer_store import OptimizerStore

NUMEL = 100_000  # per tensor: 400000 bytes -> 401408 page-rounded (the slot size)
SUB_GROUPS = 2


@pytest.fixture(autouse=True)
def debug_checks(monkeypatch):
    monkeypatch.setenv("TENCACHE_DEBUG_CHECKS", "1")


def make(io, start_bytes=0):
    return OptimizerStore(torch.float32, lambda n: -(-n // 256) * 256, io, largest_numel=NUMEL,
                          streaming_slots=8, host_tier_share=lambda: start_bytes)


def active_streaming_slots(store):
    slots = store.pool.class_slots()[store.streaming_slot_bytes]
    return slots["slots"] - slots["retired"]


@pytest.mark.parametrize("update_slots", [0, 1])
def test_keeping_everything_keeps_the_slot_an_update_still_lends_and_plans_for_it(io, tmp_path, update_slots):
    """Regression: with the gradient read from stage 3's buffer, a tier that kept all the state gave every streaming
    slot back, and each update's transient gradient brought one back: a sub-group of memory the plan did not count,
    given up and mapped again at every resize."""
    store = make(io)
    slot = store.streaming_slot_bytes
    tensors = 4 if update_slots == 0 else 3  # master, two moments and the gradient, or the gradient not kept
    state = store.state_bytes([NUMEL] * tensors * SUB_GROUPS)
    store.resize_host_footprint(state + update_slots * slot, state, reads_ahead=True, update_slots=update_slots)
    assert store.budget.total_bytes == state  # every tensor kept
    assert store.planned_host_footprint_bytes(state, True, update_slots) == state + update_slots * slot
    gradient = store.lend_new("gradient", NUMEL, str(tmp_path / "gradient.swp"), transient=True)
    store.discard("gradient")
    del gradient
    store.resize_host_footprint(state + update_slots * slot, state, reads_ahead=True, update_slots=update_slots)
    assert active_streaming_slots(store) == update_slots  # the update's slot stays; the others are given back
    assert store.host_footprint_bytes() == update_slots * slot  # nothing kept yet: only that slot is memory
    store.close()


def test_a_footprint_short_of_the_update_slot_streams(io):
    """The whole state but not the update's slot: the budget leaves room for the streaming slots instead."""
    store = make(io)
    state = store.state_bytes([NUMEL] * 3 * 6)  # 6 masters and their moments: more than the streaming slots hold
    store.resize_host_footprint(state, state, reads_ahead=True, update_slots=1)
    assert store.budget.total_bytes == state - store.least_host_footprint_bytes(True)
    store.close()


def test_bf16_state_counts_each_tensor_in_its_own_bytes_and_an_update_as_four_slots(io):
    """Regression: the store counted a sub-group's tensors as 16 bytes an element over its element size, which is
    8 tensors for bf16 masters and state (bf16_optimizer_states): it took the state for 7/3 of its bytes, so a
    budget that held all of it kept streaming slots, and the least footprint was 8 slots where an update uses 4.
    Which tensors a sub-group has is the swapper's to list since (test_optimizer_state_dtype.py)."""
    store = OptimizerStore(torch.bfloat16, lambda n: -(-n // 512) * 512, io, largest_numel=NUMEL,
                           streaming_slots=8, host_tier_share=lambda: 0)
    kept = -(-NUMEL * 2 // 4096) * 4096  # one tensor's page-rounded buffer
    assert store.state_bytes([NUMEL] * 4 * SUB_GROUPS) == SUB_GROUPS * 4 * kept  # master, two moments, gradient
    assert store.least_host_footprint_bytes(reads_ahead=False) == 4 * store.streaming_slot_bytes
    assert store.least_host_footprint_bytes(reads_ahead=True) == 8 * store.streaming_slot_bytes
    store.close()


@pytest.mark.parametrize("reads_ahead, writes_behind, tensors", [
    (False, False, 4), (True, False, 8), (False, True, 7), (True, True, 11)])
def test_the_least_footprint_counts_the_slots_writes_behind_still_hold(io, reads_ahead, writes_behind, tensors):
    """An update holds a sub-group's 4 tensors, the next one's read ahead and the last one's 3 changed tensors until
    their writes end (a released dirty entry keeps its slot): with more slots than 8 (``buffer_count`` 12, as stock's
    pipelined swapper wants for Adam), up to 11 are in use at once. Regression: the least footprint counted 8, so
    memory pressure took the other 3 for reducible and promised memory it could not give back. With 8 slots an
    update waits for a write that frees one: the least is all 8."""
    store = OptimizerStore(torch.float32, lambda n: -(-n // 256) * 256, io, largest_numel=NUMEL,
                           streaming_slots=12, host_tier_share=lambda: 0)
    assert store.least_host_footprint_bytes(reads_ahead, writes_behind) == tensors * store.streaming_slot_bytes
    store.close()
    store = make(io)  # 8 slots
    assert store.least_host_footprint_bytes(reads_ahead, writes_behind) == min(tensors, 8) * store.streaming_slot_bytes
    store.close()


def test_a_read_ahead_into_idle_slots_takes_only_streaming_slots_already_in_memory(io, tmp_path):
    """The backward reads later sub-groups ahead with ``prefetch_if_free(idle_slot=True)``: with no budget to keep
    them, an idle streaming slot will do, but never a retired one (new memory) nor one in use (a wait); the bytes
    read are the file's. ``idle_streaming_slots`` counts what is left."""
    store = make(io)  # budget 0: every tensor streams
    paths = {key: str(tmp_path / f"{key}.swp") for key in ("a", "b", "c")}
    for value, key in enumerate(paths, start=1):
        view = store.lend_new(key, NUMEL, paths[key])
        view.fill_(value)
        store.release(key, changed=True)  # not kept: written to its file
        store.wait_writes()  # its slot is free again: the next tensor streams through the same one
    assert active_streaming_slots(store) == 1  # the other 7 are still retired (no memory)
    assert store.idle_streaming_slots() == 1
    assert not store.prefetch_if_free("a")  # no budget to keep it, and no idle slot asked for
    assert store.prefetch_if_free("a", idle_slot=True)
    assert store.idle_streaming_slots() == 0
    assert not store.prefetch_if_free("b", idle_slot=True)  # the one live slot is taken; retired ones stay retired
    assert active_streaming_slots(store) == 1
    assert torch.equal(store.wait_read("a"), torch.full((NUMEL,), 1.0))
    store.release("a")
    assert store.idle_streaming_slots() == 1
    store.close()


def test_a_footprint_below_the_present_one_never_leaves_a_larger_budget(io, tmp_path):
    """Regression (helper-156's review): 6 streaming slots in memory where an update without reads ahead needs 4 (a
    slow drive, or no reads ahead: only keeping everything retires them), and no budget. Memory pressure asks for
    the footprint less a cut: the budget counted only the least slots, so it grew by the 2 slots beyond it (a
    give-back under pressure that took memory), and every later reading "gave back" the same bytes again."""
    store = make(io)  # budget 0: every tensor streams
    slot = store.streaming_slot_bytes
    keys = [f"t{index}" for index in range(6)]
    for key in keys:  # six at once: six slots brought back
        store.lend_new(key, NUMEL, str(tmp_path / f"{key}.swp")).fill_(1.0)
    for key in keys:
        store.release(key, changed=True)
    store.wait_writes()
    assert active_streaming_slots(store) == 6 and store.host_footprint_bytes() == 6 * slot
    state = store.state_bytes([NUMEL] * 100)
    store.resize_host_footprint(store.host_footprint_bytes() - slot // 2, state, reads_ahead=False)
    assert store.budget.total_bytes == 0
    store.resize_host_footprint(8 * slot, state, reads_ahead=False)  # memory back: 2 slots' worth to keep
    assert store.budget.total_bytes == 2 * slot
    store.close()


def test_a_tensor_that_no_eviction_makes_room_for_leaves_the_held_ones_held(io, tmp_path):
    """Regression (helper-189's review): with no profile, a tensor larger than all the room evictions could make (a
    300 kB budget holding a 200 kB tensor, a 400 kB one lent) evicted every held tensor (written, to be read again)
    and then went transient all the same."""
    store = make(io, start_bytes=300_000)
    held = store.lend_new("small", NUMEL // 2, str(tmp_path / "small.swp"))
    held.fill_(1.0)
    store.release("small", changed=True)
    assert store.state("small") == EntryState.DIRTY
    store.lend_new("large", NUMEL, str(tmp_path / "large.swp")).fill_(2.0)
    assert store.state("small") == EntryState.DIRTY and store.counters.evictions == 0
    store.release("large", changed=True)
    store.flush()
    assert store.state("large") == EntryState.ON_FILE
    store.close()


def test_on_a_kernel_with_64_kib_pages_the_streaming_slots_are_the_arenas(io, monkeypatch):
    """helper-235: the streaming slots' class was planned in 4 KiB units and the arena's in 64 KiB: the store
    found no slots of its size, so none counted as retired at the start, and the least footprint read 0."""
    from tencache_ds.units import ARENA_PAGE_ENV
    monkeypatch.setenv(ARENA_PAGE_ENV, str(64 * 1024))
    store = make(io)
    try:
        assert store.streaming_slot_bytes % (64 * 1024) == 0
        assert store.pool.stats()["retired_bytes"] == 8 * store.streaming_slot_bytes
        assert store.least_host_footprint_bytes(reads_ahead=True) > 0
    finally:
        store.close()
