"""Prefixes: room in the optimizer's budget that no whole tensor fits in holds the first bytes of one that streams
(cache/entry.py, cache/admission.py, cache/transfers.py). A budget smaller than one tensor still saves bytes; the
file and the prefix together always hold the newest bytes, through reads, writes, parts, flushes, memory pressure,
a checkpoint's links and a failed write. Real files, real I/O; the store's invariants are checked after every
call."""
import os
from concurrent.futures import Future

import pytest
import torch

from tencache_ds.cache.buffer_sources import BudgetedPageable
from tencache_ds.cache.entry import Entry, EntryState, check_entry
from tencache_ds.cache.entry_store import EntryStore
from tencache_ds.cache.host_budget import HostBudget
from tencache_ds.io.shared_files import LinkSafeIO
from tencache_ds.memory.pool import BufferPool
from tencache_ds.plan.eviction import PREFIX_GRANULE_BYTES, prefix_nbytes
from tencache_ds.profile.next_use import NextUseIndex

MiB = 1 << 20
NUMEL = 1 << 20           # 4 MiB per fp32 tensor
NBYTES = NUMEL * 4
KEYS = ["p", "m", "v"]    # one sub-group's master and moments, used in this order every step
BUDGET = 2 * MiB + 12345  # one granule's prefix and change: less than one tensor


@pytest.fixture(autouse=True)
def debug_checks(monkeypatch):
    monkeypatch.setenv("TENCACHE_DEBUG_CHECKS", "1")


def make(io, budget_bytes):
    pool = BufferPool("optimizer", lock="off")
    return EntryStore("optimizer", torch.float32, lambda n: -(-n // 1024) * 1024, io,
                      BudgetedPageable(pool, HostBudget(budget_bytes)))


def values(step, key):
    """Distinct bytes per step and tensor, different in every element (a misplaced granule shows)."""
    return torch.arange(NUMEL, dtype=torch.float32) + 1000.0 * step + 10.0 * KEYS.index(key)


def on_file(io, path):
    data = torch.empty(NUMEL)
    io.read(data, path).result()
    return data


def run_steps(store, tmp_path, steps, first=0):
    """Each step: every tensor read (its last step's bytes checked), changed and released, in the same order."""
    for step in range(first, first + steps):
        for key in KEYS:
            path = str(tmp_path / f"{key}.swp")
            if step == 0:
                view = store.lend_new(key, NUMEL, path)
            else:
                view = store.lend(key)
                assert torch.equal(view, values(step - 1, key)), (step, key)
            view.copy_(values(step, key))
            store.release(key, changed=True)
        store.next_use = NextUseIndex(KEYS)
    store.wait_writes()  # the I/O counters count finished requests


@pytest.mark.parametrize("budget", [0, BUDGET])
def test_a_budget_smaller_than_one_tensor_holds_a_prefix_and_saves_its_bytes_every_step(tmp_path, io, budget):
    """Regression: the tier kept whole tensors only, so a budget smaller than one (the one-sub-group 25% bench:
    357 MiB against 497 MB tensors) kept nothing and moved every byte. Now 2 MiB of it hold the first 2 MiB of one
    tensor: each step reads and writes 2 x 2 MiB less, and the prefix stays with the same tensor."""
    store = make(io, budget)
    run_steps(store, tmp_path, steps=2)
    before = io.counters()
    run_steps(store, tmp_path, steps=3, first=2)
    after = io.counters()
    read, written = after.read_bytes - before.read_bytes, after.write_bytes - before.write_bytes
    saved = 2 * MiB if budget else 0
    assert read == 3 * (3 * NBYTES - saved) and written == 3 * (3 * NBYTES - saved)
    assert store.stats()["prefix_bytes"] == saved and store.stats()["cached_tensors"] == 0
    assert store.held_keys() == (["p"] if budget else [])  # the first tensor written with spare room, every step
    assert store.counters.prefix_read_bytes_saved == 4 * saved  # every read since step 1
    # The file lacks the prefix's newest bytes until a flush writes them; then the file alone is the tensor.
    if budget:
        assert not torch.equal(on_file(io, store.path("p")), values(4, "p"))
    assert store.flush() == (1 if budget else 0)
    for key in KEYS:
        assert torch.equal(on_file(io, store.path(key)), values(4, key)), key
    store.close()


def test_a_prefix_is_folded_into_a_whole_buffer_and_given_back_under_memory_pressure(tmp_path, io):
    """Memory back: a whole buffer for the tensor takes the prefix's bytes in (owed to the file, so the entry is
    dirty); memory pressure: a dirty prefix is written before it goes. The bytes are right at every read."""
    store = make(io, BUDGET)
    run_steps(store, tmp_path, steps=2)
    assert store.stats()["prefix_bytes"] == 2 * MiB and store.state("p") == EntryState.ON_FILE
    store.source.budget.resize(BUDGET + 2 * NBYTES)  # room for "p" whole beside its prefix
    view = store.lend("p")
    assert torch.equal(view, values(1, "p")) and store.state("p") == EntryState.LENT_DIRTY
    store.release("p")                        # unchanged, but its file still lacks the prefix's bytes
    assert store.state("p") == EntryState.DIRTY and store.stats()["prefix_tensors"] == 0
    store.flush()
    assert torch.equal(on_file(io, store.path("p")), values(1, "p"))

    store.trim_kept(0)                        # "p" is clean: dropped; then a step with a prefix again
    store.source.budget.resize(BUDGET)
    run_steps(store, tmp_path, steps=1, first=2)
    holder = store.held_keys()
    assert len(holder) == 1 and store.stats()["prefix_bytes"] == 2 * MiB
    written = io.counters().write_bytes
    assert store.trim_kept(0) == 0            # the dirty prefix is written, then given back
    assert io.counters().write_bytes - written == 2 * MiB and store.stats()["prefix_tensors"] == 0
    for key in KEYS:
        assert torch.equal(on_file(io, store.path(key)), values(2, key)), key
    run_steps(store, tmp_path, steps=1, first=3)  # and reads the files right afterwards
    store.close()


def test_parts_written_across_a_prefix_go_to_it_and_to_the_file(tmp_path, io):
    """Stage 3 writes a gradient's fragments at their offsets: the elements inside a prefix go there (the file's
    are stale until a flush), the rest to the file, and a read puts them together."""
    store = make(io, BUDGET)
    run_steps(store, tmp_path, steps=2)
    assert store.held_keys() == ["p"]
    split = 2 * MiB // 4                      # the prefix's elements
    expected = values(1, "p").clone()
    parts = [(split - 10, torch.full((20,), -1.0)), (5, torch.full((3,), -2.0)), (split + 100, torch.full((7,), -3.0))]
    for offset, part in parts:
        expected[offset:offset + part.numel()] = part
    store.write_parts("p", NUMEL, store.path("p"), parts)
    assert store.state("p") == EntryState.ON_FILE
    assert torch.equal(store.lend("p"), expected)
    store.release("p")
    store.flush()
    assert torch.equal(on_file(io, store.path("p")), expected)
    store.close()


def test_a_file_shared_with_a_checkpoint_is_written_whole_and_the_checkpoint_keeps_its_bytes(tmp_path, io):
    """A checkpoint links the swap files after a flush. The next write of a tensor with a prefix writes it whole
    (a partial write would copy the file first) to a file of its own: the checkpoint keeps the flushed bytes."""
    link_safe = LinkSafeIO(io)
    store = make(link_safe, BUDGET)
    run_steps(store, tmp_path, steps=2)
    store.flush()
    checkpoint = tmp_path / "checkpoint-p.swp"
    os.link(store.path("p"), checkpoint)
    written = io.counters().write_bytes
    run_steps(store, tmp_path, steps=1, first=2)
    assert io.counters().write_bytes - written == 3 * NBYTES  # "p" whole, into a new file: nothing copied first
    assert link_safe.links_broken == 1 and store.flush() == 0  # its prefix is as clean as its file
    assert torch.equal(on_file(io, str(checkpoint)), values(1, "p"))
    assert torch.equal(on_file(io, store.path("p")), values(2, "p"))  # whole: no flush needed for "p"
    run_steps(store, tmp_path, steps=1, first=3)
    store.close()


def test_forgetting_drops_the_prefix_and_a_checkpoint_load_reads_the_new_file(tmp_path, io):
    """A checkpoint load copies files over the folder: the prefix of the old bytes must not survive it."""
    store = make(io, BUDGET)
    run_steps(store, tmp_path, steps=2)
    budget = store.source.budget
    assert budget.used_bytes == 2 * MiB
    replacement = torch.full((NUMEL,), 7.0)
    io.write(replacement, store.path("p")).result()
    for key in store.held_keys():  # what the optimizer swapper does after a load
        store.forget(key)
    assert budget.used_bytes == 0
    store.add("p", NUMEL, str(tmp_path / "p.swp"))
    assert torch.equal(store.lend("p"), replacement)
    store.release("p")
    store.close()


class FailingWrites:
    """The real engine, whose writes fail while ``failing`` (a full drive)."""

    def __init__(self, io):
        self._io, self.failing = io, False

    def write(self, *args, **kwargs):
        if self.failing:
            future = Future()
            future.set_exception(OSError(28, "No space left on device"))
            return future
        return self._io.write(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._io, name)


def test_a_failed_write_keeps_every_byte_and_the_prefix_folds_into_the_kept_buffer(tmp_path, io):
    failing = FailingWrites(io)
    store = make(failing, BUDGET)
    run_steps(store, tmp_path, steps=2)
    failing.failing = True
    saved = store.counters.prefix_write_bytes_saved
    view = store.lend("p")
    view.copy_(values(2, "p"))
    store.release("p", changed=True)          # the write fails: the buffer is kept, dirty, the prefix folded in
    with pytest.raises(OSError):
        store.flush()
    assert store.state("p") == EntryState.DIRTY and store.stats()["prefix_tensors"] == 0
    assert store.counters.prefix_write_bytes_saved == saved  # the failed write saved nothing
    failing.failing = False
    store.flush()
    assert torch.equal(on_file(io, store.path("p")), values(2, "p"))
    store.close()


def test_a_prefix_beside_a_kept_whole_buffer_fails_the_entry_check():
    entry = Entry("k", NUMEL, "k.swp", EntryState.CLEAN, buffer=object(), kept=True)
    entry.prefix, entry.prefix_nbytes = type("B", (), {"capacity_bytes": MiB})(), MiB
    with pytest.raises(AssertionError, match="prefix beside a kept whole buffer"):
        check_entry(entry)
    entry.prefix, entry.prefix_nbytes, entry.prefix_dirty = None, 0, True
    with pytest.raises(AssertionError, match="without a prefix buffer"):
        check_entry(entry)


@pytest.mark.parametrize("spare, tensor, expected", [
    (int(2.5 * PREFIX_GRANULE_BYTES), 10 * PREFIX_GRANULE_BYTES, 2 * PREFIX_GRANULE_BYTES),
    (int(2.5 * PREFIX_GRANULE_BYTES), 2 * PREFIX_GRANULE_BYTES, PREFIX_GRANULE_BYTES),  # one granule left for the file
    (PREFIX_GRANULE_BYTES - 1, 10 * PREFIX_GRANULE_BYTES, 0),
    (10 * PREFIX_GRANULE_BYTES, PREFIX_GRANULE_BYTES + 5, 0),                           # not one granule plus the rest
    (10 * PREFIX_GRANULE_BYTES, 100, 0),
])
def test_a_prefix_is_whole_granules_and_never_the_whole_tensor(spare, tensor, expected):
    assert prefix_nbytes(spare, tensor) == expected


def test_flush_key_a_whole_replacement_and_giving_up_a_lent_entrys_prefix_keep_the_newest_bytes(tmp_path, io):
    """The paths the step's cycle does not take: a reader outside the store (flush_key: the ZeRO file's masters),
    new bytes for the whole tensor into a kept buffer (the prefix is dead), and memory pressure while the tensor is
    lent (its prefix is written and goes; the release writes the whole tensor)."""
    store = make(io, BUDGET)
    run_steps(store, tmp_path, steps=2)
    store.flush_key("p")
    assert torch.equal(on_file(io, store.path("p")), values(1, "p")) and store.flush() == 0
    run_steps(store, tmp_path, steps=1, first=2)       # dirty again
    view = store.lend("p")
    store.source.budget.resize(0)                      # as the governor shrinks: the budget, then what is kept
    assert store.trim_kept(0) == 0 and store.stats()["prefix_tensors"] == 0
    view.copy_(values(3, "p"))
    store.release("p", changed=True)
    store.wait_writes()
    assert torch.equal(on_file(io, store.path("p")), values(3, "p"))
    store.source.budget.resize(BUDGET)
    view = store.lend("p")
    assert torch.equal(view, values(3, "p"))
    view.copy_(values(4, "p"))
    store.release("p", changed=True)
    store.source.budget.resize(BUDGET + 2 * NBYTES)
    assert store.held_keys() == ["p"]                  # a prefix again, dirty
    replaced = store.lend_new("p", NUMEL, store.path("p"))
    assert store.kept("p") and store.stats()["prefix_tensors"] == 0  # the prefix's bytes are dead
    replaced.fill_(-5.0)
    store.release("p", changed=True)
    store.flush()
    assert torch.equal(on_file(io, store.path("p")), torch.full((NUMEL,), -5.0))
    store.close()


def test_a_budget_grown_to_hold_a_tensor_with_its_own_prefix_keeps_it_whole(tmp_path, io):
    """Regression: prefixes never gave way, so a budget grown by less than a whole tensor (the governor's "keep
    everything" counts each tensor once) left the prefix holder streaming beside its own prefix, and gave the new
    room to another tensor's prefix. Now the holder's prefix and the spare room make room for it whole."""
    store = make(io, BUDGET)
    run_steps(store, tmp_path, steps=2)
    assert store.held_keys() == ["p"] and not store.kept("p")
    store.source.budget.resize(BUDGET + 2 * MiB)  # with "p"'s 2 MiB prefix: room for "p" whole, and no more
    run_steps(store, tmp_path, steps=2, first=2)
    assert store.kept("p") and store.held_keys() == ["p"] and store.stats()["prefix_tensors"] == 0
    store.flush()
    for key in KEYS:
        assert torch.equal(on_file(io, store.path(key)), values(3, key)), key
    store.close()
