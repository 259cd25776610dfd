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


def unregistered(state, tmp_path):
    """A swapper with one sub-group of 1024 fp32 masters whose optimizer state is ``state``, not registered yet; the
    swapper has only what registration reads. Returns it and the master."""
    swapper = object.__new__(TencacheOptimizerSwapper)  # no DeepSpeed engine
    master = torch.zeros(1024)
    master.ds_id = "0_3"
    swapper.optimizer = types.SimpleNamespace(state={master: state})
    swapper.dtype, swapper.swap_element_size, swapper.min_aio_bytes, swapper._state_dtypes = torch.float32, 4, 0, {}
    swapper.swap_params_info = {"0_3": OptimizerStateSwapInfo(master, 1024, str(tmp_path), None)}
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


@pytest.mark.parametrize("state, held", [
    ({"momentum_buffer": torch.zeros(1024, dtype=torch.bfloat16)}, [1024, 512, 1024]),  # Muon: its own bytes
    ({"exp_avg_sq": torch.zeros(1024)}, [1024, 1024, 1024]),  # DeepSpeedCPUAdagrad: one state
    ({"exp_avg": torch.zeros(1024), "exp_avg_sq": torch.zeros(1024)}, [1024] * 4),  # Adam
    (None, [1024] * 4)])  # not registered yet: counted as Adam's
def test_the_state_the_tier_would_hold_is_what_deepspeed_registered(tmp_path, state, held):
    """Regression: the tier took every sub-group for a master, two moments and a gradient, twice Muon's bytes and
    4/3 of Adagrad's, so a budget that held all of their state planned streaming slots beside it, and memory
    pressure counted on filling bytes the state never needed."""
    swapper = registered(state, tmp_path) if state is not None else unregistered({}, tmp_path)[0]
    swapper._stage3_gradients = None  # the gradient stored by the tier, as with device gradients
    swapper.store = types.SimpleNamespace(state_bytes=list)  # the tensors' numels, as the store is asked for them
    assert swapper.state_bytes() == held
