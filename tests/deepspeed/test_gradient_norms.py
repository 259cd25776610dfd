"""Stage 3's gradient norms over one reused buffer (integrations/deepspeed/gradient_norms.py) give DeepSpeed's own
norms bit for bit: one part and several, fp32 and bf16, below and above glibc's mmap threshold, in the order a
backward hands them (the buffer grown once, then reused). The engine-level check, every tencache run's clipping
against stock's bits, is test_parity.py's (its runs report the norms taken here)."""
import inspect

import pytest
import torch

pytest.importorskip("deepspeed")

from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3  # noqa: E402

from tencache_ds.integrations.deepspeed.gradient_norms import (  # noqa: E402
    SCRATCH_ATTRIBUTE, norming_in_reused_memory, release_norm_scratch)
from tencache_ds.memory.reused_scratch import ReusedScratch  # noqa: E402
from tencache_ds.plan.step_model.costs import NORM_SCRATCH_MAX_BYTES  # noqa: E402

pytestmark = pytest.mark.deepspeed


def deepspeeds_norm():
    """DeepSpeed's own method, whether or not install() has rebound the class attribute."""
    return inspect.unwrap(DeepSpeedZeroOptimizer_Stage3._constant_buffered_norm2)


class Optimizer:
    """Stands for the ZeRO-3 optimizer: DeepSpeed's method reads nothing of it; ours reads its scratch."""


def gradient(numel, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    # magnitudes over several decades, as gradients have: the float64 sum's rounding depends on the order
    values = torch.randn(numel, generator=generator) * torch.logspace(-6, 2, numel)
    return values.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_equal_deepspeeds_bit_for_bit(dtype):
    original = deepspeeds_norm()
    ours = norming_in_reused_memory(original)
    optimizer = Optimizer()
    scratch = ReusedScratch(NORM_SCRATCH_MAX_BYTES)
    setattr(optimizer, SCRATCH_ATTRIBUTE, scratch)
    # (elements, buffer_size): above the 4 Mi fp32 elements whose float64 copy glibc maps fresh; below it; several
    # parts of one gradient; a part shorter than the buffer after a longer one
    cases = [(5_000_001, 250_000_000), (300_007, 250_000_000), (2_500, 1_000), (17, 250_000_000)]
    for seed, (numel, buffer_size) in enumerate(cases):
        grad = gradient(numel, dtype, seed)
        expected = original(optimizer, grad, buffer_size)
        got = ours(optimizer, grad, buffer_size)
        assert got.dtype == expected.dtype == torch.float64
        assert got.view(torch.int64).item() == expected.view(torch.int64).item(), (numel, buffer_size)
    assert scratch.views == 5_000_001 // 250_000_000 + 1 + 1 + 3 + 1
    assert scratch.grows == 1  # the largest first: one buffer served every later norm
    assert scratch.peak_bytes == 5_000_001 * 8
    release_norm_scratch(optimizer)
    assert scratch.held_bytes == 0


def test_an_optimizer_tencache_does_not_swap_for_keeps_deepspeeds_norm():
    original = deepspeeds_norm()
    calls = []

    def recording(self, input, buffer_size=250000000):
        calls.append(input.numel())
        return original(self, input, buffer_size)

    ours = norming_in_reused_memory(recording)
    grad = gradient(1000, torch.float32, 0)
    assert ours(Optimizer(), grad).view(torch.int64).item() == original(Optimizer(), grad).view(torch.int64).item()
    assert calls == [1000]
    release_norm_scratch(Optimizer())  # nothing to release: no error


def test_a_part_above_the_ceiling_is_copied_fresh_and_the_others_reuse_the_buffer():
    original = deepspeeds_norm()
    ours = norming_in_reused_memory(original)
    optimizer = Optimizer()
    scratch = ReusedScratch(4_000 * 8)  # a ceiling of 4000 float64 elements
    setattr(optimizer, SCRATCH_ATTRIBUTE, scratch)
    for seed, (numel, buffer_size) in enumerate([(10_000, 250_000_000), (10_000, 3_000), (3_999, 250_000_000)]):
        grad = gradient(numel, torch.float32, seed)
        expected = original(optimizer, grad, buffer_size)
        assert ours(optimizer, grad, buffer_size).view(torch.int64).item() == expected.view(torch.int64).item()
    # the whole 10000 above it; its parts of 3000, 3000, 3000 and 1000 in the buffer; then 3999
    assert (scratch.refused, scratch.views, scratch.grows) == (1, 5, 2)
    assert scratch.peak_bytes == 3_999 * 8
