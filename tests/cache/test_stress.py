"""Concurrency stress: several threads drive one store at once, as DeepSpeed's autograd hooks, its prefetcher and
the optimizer do: lend, change in place and release, start a read and wait for it later, store new bytes
(write-back), copy out, flush a key and read its file behind the store's back, on overlapping keys, with evictions
(a small host budget) and real files through the real DirectFileIO. The store's invariant checks run after every
call (TENCACHE_DEBUG_CHECKS=1). Asserts: no deadlock (every thread ends within a timeout), the invariants hold,
and every byte read back, through the store or from its file, is the last one written.

A per-key lock in the test stands for DeepSpeed's rule that one partition has one borrower at a time; which
thread touches which key, in which order, is random (seeded), and keys move between threads all the time."""
import random
import threading
import time

import pytest
import torch

from tencache_ds.cache.buffer_sources import BudgetedPageable
from tencache_ds.cache.entry_store import EntryStore
from tencache_ds.cache.host_budget import HostBudget
from tencache_ds.cache.tensor_store import TensorStore
from tencache_ds.memory.pool import BufferPool

THREADS = 4
ROUNDS = 3
OPS_PER_THREAD = 60
TIMEOUT_S = 60
NUMELS = [3_000, 3_000, 20_000, 20_000, 20_000, 70_000, 70_000, 150_000]  # several size classes, overlapping
KEYS = list(range(12))


@pytest.fixture(autouse=True)
def debug_checks(monkeypatch):
    monkeypatch.setenv("TENCACHE_DEBUG_CHECKS", "1")


def aligned(numel):  # DeepSpeed's 1 KiB alignment for fp32
    return -(-numel // 256) * 256


def pattern(key, numel, version):
    """Distinct per key, per version and per position: a misplaced, stale or torn write shows."""
    return (torch.arange(numel, dtype=torch.float32) % 977) + key * 1000.0 + version * 100_000.0


class Model:
    """What each key must hold: its numel and the version last written; a lock per key (one borrower)."""

    def __init__(self, store):
        self.store = store
        self.numel = {key: NUMELS[key % len(NUMELS)] for key in KEYS}
        self.version = {key: 0 for key in KEYS}
        self.locks = {key: threading.Lock() for key in KEYS}
        self.checked_bytes = 0
        self._count_lock = threading.Lock()

    def expected(self, key):
        return pattern(key, self.numel[key], self.version[key])

    def check(self, key, tensor):
        assert torch.equal(tensor[:self.numel[key]], self.expected(key)), f"key {key} v{self.version[key]} differs"
        with self._count_lock:
            self.checked_bytes += self.numel[key] * 4


def one_op(model, rng, io):
    store = model.store
    op = rng.choice(["lend", "change", "store", "read_into", "two_reads", "flush_key"])
    if op == "two_reads":  # start two reads, then wait for both (the prefetcher's pattern)
        first, second = sorted(rng.sample(KEYS, 2))
        with model.locks[first], model.locks[second]:
            store.start_read(first)
            store.start_read(second)
            model.check(second, store.wait_read(second))
            model.check(first, store.wait_read(first))
            store.release(first)
            store.release(second)
        return
    key = rng.choice(KEYS)
    with model.locks[key]:
        if op == "lend":
            model.check(key, store.lend(key))
            store.release(key)
        elif op == "change":  # the optimizer steps in place on the lent buffer
            view = store.lend(key)
            model.check(key, view)
            view.add_(100_000.0)
            model.version[key] += 1
            store.release(key, changed=True)
        elif op == "store":  # new weights after the optimizer step (write-back)
            model.version[key] += 1
            store.store(key, model.expected(key))
        elif op == "read_into":
            dest = torch.empty(model.numel[key])
            store.read_into(key, dest)
            model.check(key, dest)
        else:  # a reader outside the store opens the file (offload_optimizer fast_init)
            store.flush_key(key)
            on_file = torch.empty(aligned(model.numel[key]))
            io.read(on_file, store.path(key)).result()
            model.check(key, on_file)


def run_rounds(model, io, seed):
    errors = []
    for round_index in range(ROUNDS):
        def worker(thread_index):
            rng = random.Random(seed * 1000 + round_index * 10 + thread_index)
            try:
                for _ in range(OPS_PER_THREAD):
                    one_op(model, rng, io)
            except BaseException as err:  # reported below, with the thread's traceback kept
                errors.append(err)

        threads = [threading.Thread(target=worker, args=(index,), daemon=True) for index in range(THREADS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + TIMEOUT_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [thread.name for thread in threads if thread.is_alive()]
        assert not stuck, f"round {round_index}: threads {stuck} did not finish in {TIMEOUT_S} s (deadlock?)"
        if errors:
            raise errors[0]
        # a step boundary: everything written back, then every file checked behind the store's back
        model.store.flush()
        model.store.check_invariants()
        for key in KEYS:
            on_file = torch.empty(aligned(model.numel[key]))
            io.read(on_file, model.store.path(key)).result()
            model.check(key, on_file)


def test_parameter_store_under_concurrent_hooks(tmp_path, io):
    """Pinned arena slots, one streaming slot per class and a cache for about a third of the bytes."""
    total = sum(aligned(NUMELS[key % len(NUMELS)]) * 4 for key in KEYS)
    store = TensorStore(str(tmp_path), torch.float32, aligned, slots_per_class=1, lock="best_effort", io=io,
                        cache_budget=HostBudget(total // 3))
    model = Model(store)
    try:
        for key in KEYS:
            view = store.staging_view(key, model.numel[key])
            view.copy_(model.expected(key))
        store.write_and_release(KEYS)
        store.plan()
        run_rounds(model, io, seed=1)
        store.pool.validate()
        stats = store.stats()
        assert stats["evictions"] > 0 and stats["hits"] > 0 and stats["misses"] > 0, stats
    finally:
        store.close()
    assert model.checked_bytes > 0


def test_optimizer_store_under_concurrent_hooks(tmp_path, io):
    """Budgeted pageable memory for about half the bytes (Belady admission before a profile: LRU)."""
    total = sum(aligned(NUMELS[key % len(NUMELS)]) * 4 for key in KEYS)
    pool = BufferPool("optimizer", lock="off")
    store = EntryStore("optimizer", torch.float32, aligned, io, BudgetedPageable(pool, HostBudget(total // 2)))
    model = Model(store)
    try:
        for key in KEYS:
            view = store.lend_new(key, model.numel[key], str(tmp_path / f"{key}.swp"))
            view.copy_(model.expected(key))
            store.release(key, changed=True)
        run_rounds(model, io, seed=2)
        stats = store.stats()
        assert stats["evictions"] > 0 and stats["hits"] > 0, stats
    finally:
        store.close()
        pool.close()
