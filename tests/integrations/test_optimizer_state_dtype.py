"""An optimizer that keeps its state in fp32 beside bf16 masters is refused when stage 3 builds the swapper (a client
optimizer, which the config check cannot see: tests/test_config_validation.py has the optimizer DeepSpeed builds).
Before, the moments were stored, and lent back, in bf16: other losses than stock CPU offload's from the third step
(gpt2-tiny). A state tensor an optimizer creates in another dtype itself (Muon's bf16 momentum beside fp32 masters)
is stored with its own bytes: tests/deepspeed/test_zero_scenarios.py, scenario ``muon``."""
import pytest
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam

from tencache_ds.errors import TencacheConfigError
from tencache_ds.integrations.deepspeed.optimizer_swapper import _refuse_states_of_another_dtype


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
