"""The I/O engine on real files: aligned (O_DIRECT) and unaligned requests, errors that name the problem."""
import os

import pytest
import torch

from tencache_ds.errors import StaleFileError, TencacheResourceError
from tencache_ds.memory.pool import BufferPool


def test_aligned_round_trip_and_counters(io, tmp_path):
    pool = BufferPool("t", lock="off")
    source = pool.acquire(1 << 20).view(torch.float32, 1 << 18)
    source.copy_(torch.arange(1 << 18, dtype=torch.float32))
    path = str(tmp_path / "a.swp")
    assert io.write(source, path).result() == 1 << 20
    target = pool.acquire(1 << 20).view(torch.float32, 1 << 18)
    io.read(target, path).result()
    assert torch.equal(source, target)
    counters = io.counters()
    assert (counters.read_bytes, counters.write_bytes, counters.read_requests) == (1 << 20, 1 << 20, 1)


def test_unaligned_views_use_buffered_io(io, tmp_path):
    data = torch.randn(10_001, dtype=torch.float64)
    path = str(tmp_path / "b.swp")
    io.write(data[3:], path, file_offset=24).result()  # odd address and length
    back = torch.empty(9_998, dtype=torch.float64)
    io.read(back, path, file_offset=24).result()
    assert torch.equal(back, data[3:])


def test_short_file_is_reported_as_stale(io, tmp_path):
    path = tmp_path / "short.swp"
    path.write_bytes(b"\0" * 4096)
    with pytest.raises(StaleFileError, match="short.swp"):
        io.read(torch.empty(8192, dtype=torch.uint8), str(path)).result()


def test_missing_file_is_reported(io, tmp_path):
    with pytest.raises(StaleFileError, match="missing"):
        io.read(torch.empty(4096, dtype=torch.uint8), str(tmp_path / "nope.swp")).result()


def test_full_device_names_the_path_and_the_key(io):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with pytest.raises(TencacheResourceError, match="nvme_path"):
        io.write(torch.ones(8192, dtype=torch.uint8), "/dev/full").result()
