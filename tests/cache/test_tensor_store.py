"""TensorStore on real files and real arena slots: bytes survive every path; shortage waits or falls back."""
import pytest
import torch

from tencache_ds.cache.tensor_store import TensorStore
from tencache_ds.io.direct_io import DirectFileIO


def aligned(numel):  # DeepSpeed's 1 KiB alignment for fp32
    return -(-numel // 256) * 256


@pytest.fixture
def store(tmp_path):
    io = DirectFileIO(num_threads=2)
    store = TensorStore(str(tmp_path), torch.float32, aligned, slots_per_class=2, lock="best_effort", io=io)
    yield store
    store.close()
    io.close()


def create(store, key, numel, seed):
    """zero.Init's path: staging buffer, fill, write, release."""
    view = store.staging_view(key, numel)
    view.copy_(torch.randn(numel, generator=torch.Generator().manual_seed(seed)))
    expected = view.clone()
    store.write_and_release([key])
    return expected


def test_create_read_release_round_trip(store):
    expected = {key: create(store, key, 300_000 + key, seed=key) for key in range(5)}
    store.plan()
    assert store.stats()["num_classes"] >= 1
    for key in range(5):
        store.start_read(key)
    for key in range(5):  # 5 reads with 2 slots per class: the rest fall back, nothing asserts
        assert torch.equal(store.wait_read(key), expected[key])
    stats = store.stats()
    assert stats["buffer_fallbacks"] >= 1 and stats["resident_tensors"] == 5
    for key in range(5):
        store.release(key)
        store.release(key)  # idempotent
    assert store.stats()["resident_tensors"] == 0 and store.pool.stats()["fallback_bytes_in_use"] == 0


def test_write_from_is_visible_to_the_next_read(store):
    create(store, "w", 100_000, seed=1)
    store.plan()
    new = torch.randn(100_000, dtype=torch.float64)
    store.write_from("w", new)          # cast to fp32, asynchronous
    store.start_read("w")               # must wait for the write
    assert torch.equal(store.wait_read("w"), new.float())
    store.release("w")


def test_writes_hold_slots_until_done_then_give_them_back(store):
    for key in range(4):
        create(store, key, 200_000, seed=key)
    store.plan()
    for key in range(4):
        store.write_from(key, torch.full((200_000,), float(key)))
    assert store.waits_for_slots >= 1          # 2 slots, 4 writes: later ones waited for earlier ones
    store.wait_writes()
    assert store.pool.stats()["in_use_bytes"] == 0
    for key in range(4):
        dest = torch.empty(200_000)
        store.read_into(key, dest)
        assert torch.all(dest == key)


def test_caller_buffer_read(store):
    expected = create(store, "c", 50_000, seed=3)
    into = torch.empty(aligned(50_000))
    store.start_read("c", into=into)
    assert torch.equal(store.wait_read("c"), expected)
    store.release("c")


@pytest.fixture
def caching_store(tmp_path):
    io = DirectFileIO(num_threads=2)
    store = TensorStore(str(tmp_path), torch.float32, aligned, slots_per_class=1, lock="best_effort", io=io,
                        cache_budget_bytes=2 * aligned(300_000) * 4 + 4096)
    yield store
    store.close()
    io.close()


def test_cache_hits_need_no_io_and_evict_least_recently_used(caching_store):
    """4 tensors, 1 streaming slot + room for ~2 cached copies: the second pass hits for the recent ones."""
    store = caching_store
    expected = {key: create(store, key, 300_000, seed=key) for key in range(4)}
    store.plan()
    for key in range(4):  # first pass: all misses, each released into the cache
        store.start_read(key)
        assert torch.equal(store.wait_read(key), expected[key])
        store.release(key)
    assert store.cache_misses == 4 and store.evictions >= 1
    reads_before = store._io.counters().read_requests
    store.start_read(3)  # most recently used: still cached
    assert torch.equal(store.wait_read(3), expected[3])
    store.release(3)
    assert store.cache_hits == 1 and store._io.counters().read_requests == reads_before
    store.start_read(0)  # least recently used: evicted, read again from file, bytes still right
    assert torch.equal(store.wait_read(0), expected[0])
    store.release(0)
    assert store.cache_misses == 5
    assert store.pool.stats()["buffer_fallbacks"] == 0


def test_write_through_keeps_the_cached_copy_current(caching_store):
    store = caching_store
    create(store, "p", 300_000, seed=5)
    store.plan()
    store.start_read("p")
    store.wait_read("p")
    store.release("p")  # now cached
    new = torch.randn(300_000)
    store.write_from("p", new)
    store.start_read("p")  # hit: the cached copy was updated, not just the file
    assert torch.equal(store.wait_read("p"), new) and store.cache_hits == 1
    store.release("p")
    store.wait_writes()
    dest = torch.empty(300_000)
    store._io.read(dest, store.record("p").path, nbytes=300_000 * 4).result()
    assert torch.equal(dest, new)  # and the file has the same bytes


def test_bytes_changed_in_place_while_resident_are_not_cached(caching_store):
    """Stage 3 copies new weights into resident partitions without writing their files (and stock DeepSpeed drops
    them at release): a copy that may have changed in place must not be served later as clean."""
    store = caching_store
    expected = create(store, "r", 300_000, seed=9)
    store.plan()
    store.start_read("r")
    view = store.wait_read("r")
    store.mark_resident_stale()
    view.fill_(0.0)          # the owner writes in place
    store.release("r")
    store.start_read("r")    # a miss: bytes come from the file, as in stock
    assert torch.equal(store.wait_read("r"), expected) and store.cache_hits == 0
    store.release("r")


def test_a_failed_read_leaves_no_partial_copy_behind(store):
    import os
    create(store, "f", 100_000, seed=4)
    store.plan()
    os.remove(store.record("f").path)
    store.start_read("f")
    with pytest.raises(Exception, match="missing"):
        store.wait_read("f")
    assert store.record("f").buffer is None and store.pool.stats()["in_use_bytes"] == 0
