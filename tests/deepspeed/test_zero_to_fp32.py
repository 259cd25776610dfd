"""DeepSpeed's own consolidation (`deepspeed.utils.zero_to_fp32`) of a checkpoint saved under tencache behaves as on
stock's checkpoint of the same run: with parameters on NVMe and the optimizer on CPU it gives stock's fp32 weights
bit for bit; with the optimizer on NVMe stock's own checkpoint cannot be consolidated (its fp32 groups are the
swapped-out placeholders), and tencache's fails the same way, no worse. Real engine, real files."""
import pytest
import torch

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]  # about 35 s each (two training runs)

QUARTER = {"host_cache_bytes": 70_000_000}  # evictions: some partitions held dirty, some on file, at the save
FAST = dict(dtype="fp32", weights_gather="none")  # fp32: see test_residency.py


def consolidate(checkpoint_dir):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    try:
        return get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag="ckpt")
    except ValueError as err:  # "consumed N numels out of 0 - something is wrong"
        return err


def checkpoints(train, tmp_path, optimizer_device):
    states = {}
    for name, block in (("stock", None), ("ours", QUARTER)):
        folder = str(tmp_path / f"ckpt-{name}")
        run = train(block=block, steps=2, save_after=1, checkpoint_dir=folder,
                    optimizer_offload_device=optimizer_device, **FAST)
        if block is not None:
            assert run.last_stats["tencache_enabled"] == 1
        states[name] = consolidate(folder)
    return states["stock"], states["ours"]


def test_zero_to_fp32_of_a_tencache_checkpoint_is_stocks_bit_for_bit(train, tmp_path):
    stock, ours = checkpoints(train, tmp_path, optimizer_device="cpu")
    assert isinstance(stock, dict) and isinstance(ours, dict), (stock, ours)
    assert list(ours) == list(stock) and len(stock) > 10
    for key, tensor in stock.items():
        assert ours[key].dtype == tensor.dtype == torch.float32, key
        assert ours[key].shape == tensor.shape, key
        assert torch.equal(ours[key].view(torch.int32), tensor.view(torch.int32)), f"{key} differs"


def test_zero_to_fp32_with_the_optimizer_on_nvme_fails_as_on_stocks_checkpoint(train, tmp_path):
    stock, ours = checkpoints(train, tmp_path, optimizer_device="nvme")
    assert isinstance(stock, ValueError), "stock's NVMe-optimizer checkpoint consolidates now: compare the weights"
    assert isinstance(ours, ValueError) and str(ours) == str(stock)
