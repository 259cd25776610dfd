"""FileCache on real files: hits avoid reads, write-back files reach storage only on eviction, files replaced
behind the cache's back are not served."""
import os
import shutil

import torch

from tencache_ds.cache.file_cache import FileCache
from tencache_ds.cache.host_budget import HostBudget


def test_write_through_then_hit(io, tmp_path):
    cache = FileCache(HostBudget(1 << 20), io, write_back=lambda path: False)
    path = str(tmp_path / "state.swp")
    data = torch.randn(4096)
    cache.write(path, data).result()
    on_disk = torch.empty(4096)
    io.read(on_disk, path).result()
    assert torch.equal(on_disk, data)            # storage is current (write-through)
    reads = io.counters().read_requests
    back = torch.empty(4096)
    assert cache.read(path, back) and torch.equal(back, data)
    assert io.counters().read_requests == reads  # served from memory


def test_write_back_reaches_storage_only_on_eviction(io, tmp_path):
    budget = HostBudget(2 * 16384)
    cache = FileCache(budget, io, write_back=lambda path: "_gradient_" in path)
    first, second, third = (str(tmp_path / f"p_gradient_{i}.swp") for i in range(3))
    tensors = [torch.full((4096,), float(i)) for i in range(3)]
    cache.write(first, tensors[0]).result()
    assert not os.path.exists(first)             # nothing written yet
    cache.write(second, tensors[1])
    cache.write(third, tensors[2])               # budget for two: the least recently used is evicted
    assert os.path.exists(first) and cache.evictions == 1
    back = torch.empty(4096)
    assert not cache.read(first, back)           # a miss now: caller reads storage, which has the bytes
    io.read(back, first).result()
    assert torch.equal(back, tensors[0])
    assert budget.used_bytes == 2 * 16384


def test_file_replaced_behind_the_cache_is_not_served(io, tmp_path):
    """Regression guard for checkpoint load: DeepSpeed copies checkpoint files over the swap folder."""
    cache = FileCache(HostBudget(1 << 20), io, write_back=lambda path: False)
    path = str(tmp_path / "state.swp")
    cache.write(path, torch.zeros(4096)).result()
    replacement = tmp_path / "from_checkpoint.swp"
    io.write(torch.ones(4096), str(replacement)).result()
    shutil.copyfile(replacement, path)
    back = torch.empty(4096)
    assert not cache.read(path, back)


def test_too_big_or_no_budget_passes_through(io, tmp_path):
    cache = FileCache(HostBudget(1024), io, write_back=lambda path: True)
    path = str(tmp_path / "big_gradient_.swp")
    cache.write(path, torch.ones(4096)).result()
    assert os.path.getsize(path) == 16384 and cache.stats()["files"] == 0


def test_cyclic_scan_keeps_a_fixed_share_once_the_order_is_known(io, tmp_path):
    """The optimizer reads and rewrites its files in the same order every step. With room for 2 of 4 files,
    least recently used misses every read; with the profiled order (Belady with bypass) 2 of 4 reads hit."""
    from tencache_ds.plan.next_use import NextUseIndex
    paths = [str(tmp_path / f"{name}.tensor.swp") for name in "abcd"]
    for path in paths:
        io.write(torch.zeros(4096), path).result()

    def one_step(cache):
        hits_before = cache.hits
        for path in paths:
            buffer = torch.empty(4096)
            if not cache.read(path, buffer):
                io.read(buffer, path).result()
            cache.write(path, buffer).result()
        cache.next_use = NextUseIndex(cache.recorder.end_step()) if with_profile else None
        return cache.hits - hits_before

    for with_profile, expected_hits in ((False, 0), (True, 2)):
        cache = FileCache(HostBudget(2 * 16384), io, write_back=lambda path: False)
        hits = [one_step(cache) for _ in range(4)]
        assert hits[-1] == expected_hits, (with_profile, hits)
