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

from tencache_ds.errors import TencacheConfigError
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


def registered(state, tmp_path):
    """A sub-group of 1024 fp32 masters whose optimizer state is ``state``, registered as DeepSpeed registers it at
    a swap (``_get_param_swap_info``); the swapper has only what registration reads. Returns the swapper."""
    swapper = object.__new__(TencacheOptimizerSwapper)  # no DeepSpeed engine
    master = torch.zeros(1024)
    master.ds_id = "0_3"
    swapper.optimizer = types.SimpleNamespace(state={master: state})
    swapper.dtype, swapper.swap_element_size, swapper.min_aio_bytes, swapper._state_dtypes = torch.float32, 4, 0, {}
    swapper.swap_params_info = {"0_3": OptimizerStateSwapInfo(master, 1024, str(tmp_path), None)}
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
