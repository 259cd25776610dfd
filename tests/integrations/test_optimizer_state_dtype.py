"""The optimizer tier stores a sub-group's tensors in the masters' dtype (integrations/deepspeed/optimizer_swapper.py):
an optimizer that keeps its state in fp32 beside bf16 masters is refused when stage 3 builds the swapper (a client
optimizer, which the config check cannot see: tests/test_config_validation.py has the optimizer DeepSpeed builds),
and a state tensor of another dtype is refused at its first store rather than narrowed. Before, the moments were
stored, and lent back, in bf16: other losses than stock CPU offload's from the third step (gpt2-tiny)."""
import pytest
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam

from tencache_ds.errors import TencacheConfigError
from tencache_ds.integrations.deepspeed.optimizer_swapper import (_refuse_state_tensor_of_another_dtype,
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


def test_a_state_tensor_of_another_dtype_is_refused_at_its_first_store():
    path = "/nvme/optimizer/rank0/12.exp_avg.tensor.swp"
    with pytest.raises(TencacheConfigError, match=r"exp_avg.*float32.*bfloat16"):
        _refuse_state_tensor_of_another_dtype(path, torch.zeros(4), torch.bfloat16)
    _refuse_state_tensor_of_another_dtype(path, torch.zeros(4), torch.float32)
