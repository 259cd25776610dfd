"""A state tensor kept in another dtype than its store's (cache/state_dtype.py): its bytes in the store's elements,
viewed back without a copy or a cast, and a swap file in stock DeepSpeed's widened layout narrowed only when no
value changes (DeepSpeed's Muon keeps its momentum in bf16 beside fp32 masters; stock's NVMe offload widens it to
fp32 on file)."""
import os

import pytest
import torch

from tencache_ds.cache.state_dtype import narrow_stock_layout, stored_numel, viewed_as
from tencache_ds.errors import TencacheError


@pytest.mark.parametrize("numel", [1, 3, 4096, 1048577])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.uint8])
def test_a_narrower_state_keeps_its_bytes_in_the_stores_buffer(numel, dtype):
    words = stored_numel(numel, dtype, torch.float32)
    assert words * 4 >= numel * dtype.itemsize > (words - 1) * 4
    buffer = torch.zeros(words + 7, dtype=torch.float32).narrow(0, 3, words)  # a view at an offset, as lent
    state = viewed_as(buffer, numel, dtype)
    values = torch.arange(numel).to(dtype)
    state.copy_(values)
    assert state.dtype == dtype and state.numel() == numel
    assert state.data_ptr() == buffer.data_ptr()  # the same memory: never a copy
    assert torch.equal(viewed_as(buffer.clone(), numel, dtype), values)  # the bytes themselves carry the values


def stock_file(tmp_path, values, store_dtype=torch.float32):
    """A swap file as stock's NVMe offload writes a state: widened to the masters' dtype, padded."""
    path = tmp_path / "momentum_buffer-0_2.tensor.swp"
    padded = torch.zeros(4096, dtype=store_dtype)
    padded[:values.numel()] = values.to(store_dtype)
    path.write_bytes(padded.numpy().tobytes())
    return str(path)


def test_stocks_widened_file_is_narrowed_when_every_value_fits(tmp_path):
    values = torch.randn(1000).to(torch.bfloat16)
    path = stock_file(tmp_path, values)
    linked = str(tmp_path / "checkpoint-copy.swp")
    os.link(path, linked)  # a checkpoint's file linked into the swap folder
    assert narrow_stock_layout(path, 1000, torch.bfloat16, torch.float32, own_bytes=4096, stock_bytes=16384)
    assert os.path.getsize(path) == 4096
    narrowed = torch.from_file(path, size=1000, dtype=torch.bfloat16)
    assert torch.equal(narrowed, values)
    assert os.path.getsize(linked) == 16384  # the checkpoint's copy is left as it was
    assert not narrow_stock_layout(path, 1000, torch.bfloat16, torch.float32, own_bytes=4096, stock_bytes=16384)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_widened_nan_is_narrowed_to_its_own_bits(tmp_path, dtype):
    """Regression test (helper-217): a NaN in stock's widened file was refused as a value the narrow dtype "does not
    hold" (NaN equals nothing), and a cast back would have given another NaN's bits (bf16 0x7FC1 -> 0xFFFF). The
    bits stock widened are the bits kept (fp16's widening on the CPU already made every NaN 0x7FFFFFFF: its narrowing
    is that NaN's, as stock's own load would cast it)."""
    bits = torch.tensor([0x7FC1, 0x3F80, -0x4080, 0x7E01] if dtype == torch.bfloat16 else [0x7E01, 0x3C00, -0x4400,
                                                                                           0x7C01], dtype=torch.int16)
    values = bits.view(dtype)
    path = stock_file(tmp_path, values)
    assert narrow_stock_layout(path, 4, dtype, torch.float32, own_bytes=4096, stock_bytes=16384)
    narrowed = torch.from_file(path, size=4, dtype=dtype)
    expected = bits if dtype == torch.bfloat16 else values.to(torch.float32).to(dtype).view(torch.int16)
    assert torch.equal(narrowed.view(torch.int16), expected)


def test_stocks_file_with_values_the_narrow_dtype_cannot_hold_is_refused(tmp_path):
    values = torch.randn(1000)  # fp32 values: stock kept the state wider than the optimizer made it
    path = stock_file(tmp_path, values)
    with pytest.raises(TencacheError, match=r"momentum_buffer-0_2\.tensor\.swp.*torch\.float32.*torch\.bfloat16.*"
                                            r"offload_optimizer\.device"):
        narrow_stock_layout(path, 1000, torch.bfloat16, torch.float32, own_bytes=4096, stock_bytes=16384)
    assert os.path.getsize(path) == 16384  # nothing changed


def test_a_file_in_the_stores_own_layout_or_missing_is_left_alone(tmp_path):
    path = tmp_path / "own.swp"
    path.write_bytes(b"\0" * 4096)
    assert not narrow_stock_layout(str(path), 1000, torch.bfloat16, torch.float32, own_bytes=4096, stock_bytes=16384)
    assert not narrow_stock_layout(str(tmp_path / "none.swp"), 1000, torch.bfloat16, torch.float32, 4096, 16384)


def test_a_narrowing_that_fails_leaves_the_old_file_and_no_staged_one(tmp_path, monkeypatch):
    values = torch.randn(1000).to(torch.bfloat16)
    path = stock_file(tmp_path, values)

    def disk_full(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space"):
        narrow_stock_layout(path, 1000, torch.bfloat16, torch.float32, own_bytes=4096, stock_bytes=16384)
    assert sorted(os.listdir(tmp_path)) == ["momentum_buffer-0_2.tensor.swp"]
    assert os.path.getsize(path) == 16384


def test_a_narrowed_file_is_written_under_a_hidden_name_a_start_sweeps(tmp_path, monkeypatch):
    """Killed while writing it, the narrowed copy (a whole swap file) was left for good under a name no sweep knew
    (helper-155's review): it is a ``hidden_name`` of its own kind, which the optimizer swapper's start sweeps."""
    from tencache_ds.cache.state_dtype import NARROWING_KIND
    from tencache_ds.io.stale_files import hidden_parts
    values = torch.randn(1000).to(torch.bfloat16)
    path = stock_file(tmp_path, values)
    staged = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda source, target: staged.append(source) or replace(source, target))
    assert narrow_stock_layout(path, 1000, torch.bfloat16, torch.float32, own_bytes=4096, stock_bytes=16384)
    assert hidden_parts(os.path.basename(staged[0]))[0] == NARROWING_KIND
