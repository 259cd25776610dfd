"""StagedDeviceCopy (memory/device_staging.py): the chunking and the pipelined copy-out, run on host tensors with
``stage_host_tensors`` (no GPU here); the CUDA side is one non_blocking copy and one event per chunk."""
import pytest
import torch

from tencache_ds.memory.device_staging import StagedDeviceCopy


def _sources(sizes, dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(size, generator=generator).to(dtype) for size in sizes]


@pytest.mark.parametrize("sizes", [[1], [1024], [1025], [3000, 7, 1, 5000], [0, 10, 0], [4096 * 5 + 3]])
def test_every_byte_arrives_through_small_chunks(sizes):
    staging = StagedDeviceCopy(chunk_bytes=4096, stage_host_tensors=True)
    sources = _sources(sizes)
    destinations = [torch.full((size,), float("nan")) for size in sizes]
    staging.copy(list(zip(destinations, sources)))
    for destination, source in zip(destinations, sources):
        assert torch.equal(destination, source)
    total = sum(sizes) * 4
    assert staging.stats()["staging_bytes"] == total
    assert staging.stats()["staging_reserved_bytes"] == 2 * 4096
    staging.close()


def test_small_sources_share_a_chunk_and_large_ones_span_several():
    staging = StagedDeviceCopy(chunk_bytes=4096, stage_host_tensors=True)
    small = _sources([16] * 8)  # 64 B each, aligned to 64: 8 fit in one chunk
    staging.copy([(torch.empty(16), source) for source in small])
    assert staging.chunks_filled == 1
    staging.copy([(torch.empty(3000), source) for source in _sources([3000])])  # 12000 B: 3 chunks
    assert staging.chunks_filled == 1 + 3
    staging.close()


def test_destinations_of_another_dtype_get_the_cast_of_the_source():
    staging = StagedDeviceCopy(chunk_bytes=4096, stage_host_tensors=True)
    sources = _sources([5000, 3], dtype=torch.bfloat16)
    destinations = [torch.empty(5000), torch.empty(3)]
    staging.copy(list(zip(destinations, sources)))
    for destination, source in zip(destinations, sources):
        assert torch.equal(destination, source.float())
    staging.close()


def test_views_into_one_buffer_are_filled_in_place():
    """What write_parts hands it: slices of one held buffer, the bytes between them left as they were."""
    staging = StagedDeviceCopy(chunk_bytes=4096, stage_host_tensors=True)
    held = torch.zeros(10000)
    parts = [(0, _sources([1500])[0]), (4000, _sources([2500])[0])]
    staging.copy([(held.narrow(0, offset, part.numel()), part) for offset, part in parts])
    assert torch.equal(held[:1500], parts[0][1]) and torch.equal(held[4000:6500], parts[1][1])
    assert not held[1500:4000].any() and not held[6500:].any()
    staging.close()


def test_host_sources_are_copied_directly_without_staging_memory():
    staging = StagedDeviceCopy()
    source = _sources([100])[0]
    destination = torch.empty(100)
    staging.copy([(destination, source)])
    assert torch.equal(destination, source)
    assert staging.stats() == {"staging_reserved_bytes": 0, "staging_registered_bytes": 0, "staging_bytes": 0,
                               "staging_chunks_filled": 0}


def test_chunk_size_must_hold_an_aligned_piece():
    with pytest.raises(ValueError, match="chunk_bytes"):
        StagedDeviceCopy(chunk_bytes=100)


def test_a_destination_of_another_size_or_a_copy_after_close_is_refused():
    staging = StagedDeviceCopy(chunk_bytes=4096, stage_host_tensors=True)
    with pytest.raises(ValueError, match="destination of 9 elements"):
        staging.copy([(torch.empty(9), torch.zeros(10))])
    with pytest.raises(ValueError, match="not contiguous"):
        staging.copy([(torch.empty(10, 2)[:, 0], torch.zeros(10))])
    staging.close()
    with pytest.raises(ValueError, match="after close"):
        staging.copy([(torch.empty(10), torch.zeros(10))])


def test_empty_sources_map_no_staging_memory():
    staging = StagedDeviceCopy(chunk_bytes=4096, stage_host_tensors=True)
    staging.copy([(torch.empty(0), torch.zeros(0))])
    assert staging.stats()["staging_reserved_bytes"] == 0


def test_the_test_switch_that_stages_host_parts_names_itself_when_it_is_not_a_size(monkeypatch):
    monkeypatch.setenv("TENCACHE_STAGE_HOST_PARTS", "lots")
    with pytest.raises(ValueError, match="TENCACHE_STAGE_HOST_PARTS='lots'"):
        StagedDeviceCopy.for_store("optimizer-staging")
    monkeypatch.setenv("TENCACHE_STAGE_HOST_PARTS", "0")  # a number, but not a chunk size: still named
    with pytest.raises(ValueError, match="TENCACHE_STAGE_HOST_PARTS='0'.*multiple of 64"):
        StagedDeviceCopy.for_store("optimizer-staging")
    monkeypatch.setenv("TENCACHE_STAGE_HOST_PARTS", "65536")
    assert StagedDeviceCopy.for_store("optimizer-staging").stages(torch.zeros(1))
    monkeypatch.delenv("TENCACHE_STAGE_HOST_PARTS")
    assert not StagedDeviceCopy.for_store("optimizer-staging").stages(torch.zeros(1))
