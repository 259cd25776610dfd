"""The free memory a GPU's device tier is sized from (integrations/deepspeed/config_bridge.device_free_bytes), and that
a configured size reads nothing (coordinator.propose_device_budget). No GPU here: CUDA's calls are stand-ins that
say what the real ones return (torch.cuda.mem_get_info: free and total bytes of the current device; the caching
allocator's reserved and allocated bytes); scripts/gpu_check.sh runs the tier on a real one."""
import types

import pytest

pytest.importorskip("deepspeed")
from tencache_ds.integrations.deepspeed import config_bridge, coordinator  # noqa: E402

GIB = 1 << 30


class NvmlByIndex:
    """DeepSpeed's CUDA accelerator: available_memory() parses CUDA_VISIBLE_DEVICES as integers for NVML."""

    def device_name(self):
        return "cuda"

    def available_memory(self):
        raise ValueError("invalid literal for int() with base 10: 'MIG-4b0c'")


def test_the_free_memory_is_cudas_not_nvmls(monkeypatch):
    """With CUDA_VISIBLE_DEVICES=MIG-... (or GPU-<uuid>) DeepSpeed's available_memory() raised at the second
    step's first forward, whatever device_cache_bytes said, where stock trains (helper-175). The allocator's free
    blocks stay counted as used, as NVML counted them (helper-179: counted free, the tier left no room at the step's
    peak)."""
    cuda = types.SimpleNamespace(is_available=lambda: True, current_device=lambda: 0,
                                 mem_get_info=lambda device: (30 * GIB, 80 * GIB),
                                 memory_reserved=lambda device: 50 * GIB, memory_allocated=lambda device: 21 * GIB)
    monkeypatch.setattr(config_bridge.torch, "cuda", cuda)
    assert config_bridge.device_free_bytes(NvmlByIndex()) == 30 * GIB  # the allocator's free blocks: used
    other = types.SimpleNamespace(device_name=lambda: "xpu", available_memory=lambda: 7 * GIB)
    assert config_bridge.device_free_bytes(other) == 7 * GIB


def test_a_configured_device_budget_reads_no_device_memory(monkeypatch):
    """A size given is the budget (plan/device_tier.device_tier_budget): the reading, which can raise (above), is
    not made."""
    swapper = types.SimpleNamespace(config=types.SimpleNamespace(device_cache_bytes=4 * GIB))
    standin = types.SimpleNamespace(swapper=swapper, gathers_alias_partitions=False, tier=None)
    monkeypatch.setattr(coordinator, "accelerator_is_host", lambda: False)
    monkeypatch.setattr(coordinator, "get_accelerator", lambda: NvmlByIndex())
    assert coordinator.TencacheCoordinator.propose_device_budget(standin) == 4 * GIB
    swapper.config.device_cache_bytes = "auto"
    with pytest.raises(ValueError):  # (the stand-in's NVML reading: "auto" on CUDA reads torch's instead)
        coordinator.TencacheCoordinator.propose_device_budget(standin)
