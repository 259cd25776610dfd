"""The host tier's split by NVMe I/O saved per held byte (pure)."""
from tencache_ds.plan.host_tier import (OPTIMIZER_IO_BYTES_PER_HELD_BYTE, PARAM_IO_BYTES_PER_HELD_BYTE,
                                        TierDemand, split_host_budget)

PARAMS = lambda n: TierDemand("params", n, PARAM_IO_BYTES_PER_HELD_BYTE)          # noqa: E731
OPTIMIZER = lambda n: TierDemand("optimizer", n, OPTIMIZER_IO_BYTES_PER_HELD_BYTE)  # noqa: E731


def test_parameters_first_because_each_held_byte_saves_more_io():
    assert split_host_budget(100, [OPTIMIZER(480), PARAMS(60)]) == {"optimizer": 40, "params": 60}


def test_everything_fits():
    assert split_host_budget(10_000, [PARAMS(60), OPTIMIZER(480)]) == {"params": 60, "optimizer": 480}


def test_a_budget_smaller_than_the_parameters_goes_to_them_alone():
    assert split_host_budget(50, [PARAMS(60), OPTIMIZER(480)]) == {"params": 50, "optimizer": 0}


def test_zero_and_negative_budgets_give_nothing():
    assert split_host_budget(0, [PARAMS(60), OPTIMIZER(480)]) == {"params": 0, "optimizer": 0}
    assert split_host_budget(-5, [PARAMS(60)]) == {"params": 0}
