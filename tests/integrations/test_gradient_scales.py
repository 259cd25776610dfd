"""The factor stage 3 scales a sub-group's gradient by (integrations/deepspeed/stage3_gradients.py
``noting_gradient_scales``), learnt by running DeepSpeed 0.19.8's own ``unscale_and_clip_grads`` on a probe: applied
to a copy of the gradient, it gives the bytes the real call leaves, in each dtype a master may have (bf16 masters:
``bf16_master_weights_and_grads``), with clipping and with a loss scale; and it is noted only after the real call,
for a swapped sub-group, and for an optimizer swapper that asks."""
import inspect
import types

import pytest
import torch
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

from tencache_ds.integrations.deepspeed.stage3_gradients import noting_gradient_scales

# DeepSpeed's own body (importing tencache_ds installed the wrapper on the class already)
WRAPPED = noting_gradient_scales(inspect.unwrap(DeepSpeedZeroOptimizer_Stage3.unscale_and_clip_grads))


def stage3(gradient, loss_scale, clip_grad, swapped=True, swapper=True):
    """The attributes unscale_and_clip_grads and its wrapper read, and the factors the swapper was told."""
    noted = []
    master = types.SimpleNamespace(grad=gradient)
    optimizer_swapper = types.SimpleNamespace(gradient_scaled=lambda param, factor: noted.append((param, factor)))
    return types.SimpleNamespace(loss_scale=loss_scale, clip_grad=clip_grad, fp32_partitioned_groups_flat={0: master},
                                 optimizer_swapper=optimizer_swapper if swapper else None,
                                 _swappable_optimizer_subgroup=lambda i: swapped), master, noted


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("loss_scale, clip_grad, norm", [(1.0, 1.0, 3.7), (1.0, 0.0, 3.7), (2.0 ** 8, 1.0, 900.0)])
def test_the_noted_factor_replayed_on_a_copy_gives_the_real_calls_bytes(dtype, loss_scale, clip_grad, norm):
    gradient = torch.randn(100_000, generator=torch.Generator().manual_seed(3)).to(dtype)
    original = gradient.clone()
    optimizer, master, noted = stage3(gradient, loss_scale, clip_grad)
    WRAPPED(optimizer, 0, torch.tensor(norm))
    [(param, factor)] = noted
    assert param is master and factor.dtype == torch.float32 and factor.numel() == 1
    assert torch.equal(original.mul_(factor), gradient)  # the real call scaled the gradient itself, once


def test_nothing_is_noted_for_a_sub_group_not_swapped_or_a_swapper_that_does_not_ask():
    for swapped, swapper in ((False, True), (True, False)):
        gradient = torch.ones(4)
        optimizer, _master, noted = stage3(gradient, 1.0, 1.0, swapped=swapped, swapper=swapper)
        WRAPPED(optimizer, 0, torch.tensor(4.0))
        assert noted == [] and torch.allclose(gradient, torch.full((4,), 0.25))


def test_a_call_that_raises_notes_nothing():
    optimizer, _master, noted = stage3(torch.ones(4, dtype=torch.int64), 1.0, 1.0)  # the real call's mul_ fails
    with pytest.raises(RuntimeError):
        WRAPPED(optimizer, 0, torch.tensor(4.0))
    assert noted == []
