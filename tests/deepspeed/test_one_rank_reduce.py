"""Stage 3's reduce-scatter at a group of one rank, for a tencache optimizer on a host accelerator
(integrations/deepspeed/one_rank_reduce.py): views of the gradients themselves, with the bits, shapes and dtypes
DeepSpeed's function returns from its new buffer; for an optimizer tencache does not swap for, DeepSpeed's own
path. The engine-level checks: test_parity.py (one rank, stock's bits, the path taken) and test_residency.py
(two ranks: not taken)."""
import os

import pytest

from conftest import result_of, run_helper

pytestmark = pytest.mark.deepspeed
SCRIPT = os.path.join(os.path.dirname(__file__), "one_rank_reduce_check.py")


def test_at_one_rank_a_tencache_optimizer_gets_views_with_deepspeeds_values_and_each_gradient_at_once():
    proc = run_helper(SCRIPT, [], timeout=300, env={"MASTER_PORT": "0"})
    result = result_of(proc.stdout)
    assert result is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert result.pop("reduces_to_views") == [True, False]
    assert result.pop("partitions_at_once") == [True, False, True, False]  # 1 rank, off, 2 ranks, 3 ranks
    assert result.pop("views_at_two_ranks") is False
    assert result.pop("without_reduce_scatter_counted") == 0
    at_once, deepspeeds = {"flushed": [[1, 6]], "counted": 1}, {"flushed": ["deepspeed's add"], "counted": 0}
    assert result.pop("added") == {
        "fp32 model and gradient": at_once, "bf16 gradient, fp32 communication": at_once,
        "fp32 gradient, bf16 model and communication": deepspeeds, "stock optimizer": deepspeeds,
        "without reduce_scatter": deepspeeds, "zenflow": deepspeeds}
    for name, checks in result.items():
        assert checks["same_bits"] and checks["shapes"] and checks["inputs_unchanged"], (name, checks)
        assert all(checks["views_of_inputs"]), (name, checks)  # no new buffer
        assert checks["counted"] == [1, 0], (name, checks)  # the tencache optimizer's call only


def test_the_step_model_partitions_at_once_where_the_run_does():
    """One fact in two layers (plan/ never imports DeepSpeed): the largest group the run partitions each gradient of
    at once, and the step model's mirror of it (plan/step_model/costs.py partitions_gradients_at_once)."""
    from tencache_ds.integrations.deepspeed import one_rank_reduce
    from tencache_ds.plan.step_model import costs
    assert one_rank_reduce.AT_ONCE_MAX_GROUP_RANKS == costs.AT_ONCE_MAX_GROUP_RANKS == 2
