"""An optimizer that keeps its state in fp32 beside bf16 masters is refused when stage 3 builds the swapper (a client
optimizer, which the config check cannot see: tests/test_config_validation.py has the optimizer DeepSpeed builds).
Before, the moments were stored, and lent back, in bf16: other losses than stock CPU offload's from the third step
(gpt2-tiny). A state tensor an optimizer creates in another dtype itself is noted when DeepSpeed registers it: a
narrower one (Muon's bf16 momentum beside fp32 masters) is stored with its own bytes (end to end:
tests/deepspeed/test_zero_scenarios.py, scenario ``muon``), a wider one refused."""
import types

import pytest
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
from deepspeed.runtime.swap_tensor.optimizer_utils import OptimizerStateSwapInfo

from tencache_ds.cache.optimizer_store import OptimizerStore
from tencache_ds.errors import TencacheConfigError
from tencache_ds.integrations.deepspeed.optimizer_gradients import SubGroupGradients
from tencache_ds.integrations.deepspeed.optimizer_swapper import (TencacheOptimizerSwapper,
                                                                  _refuse_states_of_another_dtype)


def adam(fp32_optimizer_states):
    return DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))],
                            fp32_optimizer_states=fp32_optimizer_states)


def test_an_optimizer_keeping_fp32_state_beside_bf16_masters_is_refused_naming_the_keys():
    with pytest.raises(TencacheConfigError, match=r"bf16\.bf16_master_weights_and_grads.*DeepSpeedCPUAdam.*"
                                                  r"fp32_optimizer_states=False"):
        _refuse_states_of_another_dtype(adam(True), torch.bfloat16)


@pytest.mark.parametrize("fp32_states, masters", [(False, torch.bfloat16), (True, torch.float32)])
def test_state_in_the_masters_dtype_passes(fp32_states, masters):
    _refuse_states_of_another_dtype(adam(fp32_states), masters)


def unregistered(state, tmp_path, numel=1024):
    """A swapper with one sub-group of ``numel`` fp32 masters whose optimizer state is ``state``, not registered
    yet; the swapper has only what registration reads. Returns it and the master."""
    swapper = object.__new__(TencacheOptimizerSwapper)  # no DeepSpeed engine
    master = torch.zeros(numel)
    master.ds_id = "0_3"
    swapper.optimizer = types.SimpleNamespace(state={master: state})
    swapper.dtype, swapper.swap_element_size, swapper.min_aio_bytes, swapper._state_dtypes = torch.float32, 4, 0, {}
    swapper.swap_params_info = {"0_3": OptimizerStateSwapInfo(master, numel, str(tmp_path), None)}
    return swapper, master


def registered(state, tmp_path):
    """That sub-group's state registered as DeepSpeed registers it at a swap (``_get_param_swap_info``)."""
    swapper, master = unregistered(state, tmp_path)
    swapper._get_param_swap_info(master)
    return swapper


def test_a_narrower_state_is_noted_for_its_own_bytes_and_one_in_the_masters_dtype_is_not(tmp_path):
    swapper = registered({"momentum_buffer": torch.zeros(1024, dtype=torch.bfloat16),
                          "exp_avg": torch.zeros(1024)}, tmp_path)
    assert swapper._state_dtypes == {str(tmp_path / "momentum_buffer-0_3.tensor.swp"): torch.bfloat16}
    assert swapper._stored_numel(str(tmp_path / "momentum_buffer-0_3.tensor.swp"), 1024) == 512
    assert swapper._stored_numel(str(tmp_path / "exp_avg-0_3.tensor.swp"), 1024) == 1024


def test_a_state_wider_than_the_masters_is_refused_naming_it(tmp_path):
    with pytest.raises(TencacheConfigError, match=r"exp_avg-0_3\.tensor\.swp is torch\.float64.*torch\.float32 "
                                                  r"masters.*offload_optimizer\.device"):
        registered({"exp_avg": torch.zeros(1024, dtype=torch.float64)}, tmp_path)


NUMEL = 4096  # 16 KiB in fp32, 8 KiB in bf16: whole pages, so a narrow state's saving shows in the buffers


@pytest.mark.parametrize("state, held_tensors", [
    ({"momentum_buffer": torch.zeros(NUMEL, dtype=torch.bfloat16)}, 2.5),  # Muon: its own bytes, half a tensor
    ({"exp_avg_sq": torch.zeros(NUMEL)}, 3),  # DeepSpeedCPUAdagrad: one state
    ({"exp_avg": torch.zeros(NUMEL), "exp_avg_sq": torch.zeros(NUMEL)}, 4),  # Adam
    ({"momentum_buffer": torch.zeros(4)}, 2),  # made, too small to swap: DeepSpeed keeps it, the tier holds none
    ({"exp_avg": torch.Tensor(), "step": torch.tensor(3.0)}, 4),  # forgotten at a load (purge_state): placeholders
    (None, 4)])  # not made yet: counted as Adam's
def test_the_state_the_tier_would_hold_is_what_deepspeed_registered(io, tmp_path, state, held_tensors):
    """Regression: the tier took every sub-group for a master, two moments and a gradient, 1.6 times Muon's bytes
    and 4/3 of Adagrad's, so a budget that held all of their state planned streaming slots beside it, and memory
    pressure counted on filling bytes the state never needed."""
    swapper, master = unregistered({} if state is None else state, tmp_path, numel=NUMEL)
    swapper.min_aio_bytes = 1024
    if state is not None:
        swapper._get_param_swap_info(master)  # registered as DeepSpeed registers it at a swap
    swapper.store = OptimizerStore(torch.float32, lambda n: n, io, largest_numel=NUMEL, streaming_slots=8,
                                   host_tier_share=lambda: 0)
    # no lookup of stage 3's copies: the gradient stored by the tier, as with device gradients
    swapper.gradients = SubGroupGradients(None, swapper.store, torch.float32)
    try:
        assert swapper.state_bytes() == held_tensors * NUMEL * 4
    finally:
        swapper.store.close()
