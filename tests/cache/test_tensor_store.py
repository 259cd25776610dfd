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
