"""The beta products a resume gives DeepSpeedCPUAdam's C++ optimizer (integrations/deepspeed/adam_beta_products.py
``step_product_calls``): the shortened replay leaves them as the whole history does, checked through the real C++
op: after each replay, one more update of the same tensors gives the same bits. The real engines' resumes:
tests/deepspeed/test_exact_resume.py and test_upstream_checkpoints.py."""
import pytest
import torch

pytest.importorskip("deepspeed")
from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: E402

from tencache_ds.integrations.deepspeed.adam_beta_products import step_product_calls  # noqa: E402

ADAM, OTHER = ((0.9, 0.999), 1e-8), ((0.8, 0.99), 1e-6)
LAST = 30  # a step count at which a running product and pow differ in their last bits (at 1000 they agree)


def whole_history(sub_groups):
    last = max(step for step, _betas, _eps in sub_groups)
    return [(step, betas, eps) for step in range(1, last + 1)
            for saved_step, betas, eps in sub_groups if saved_step >= step]


@pytest.fixture(scope="module")
def optimizer():
    return DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(1))])


def next_update_after(optimizer, calls, next_step, betas, eps):
    """The C++ optimizer reset as the resume resets it (whatever it held), given ``calls``, then one real update:
    its bits. ``calls`` None: as it is, no reset."""
    scratch = [torch.zeros(64) for _ in range(4)]
    if calls is not None:
        optimizer.ds_opt_adam.adam_update(optimizer.opt_id, 0, 0.0, float("nan"), float("nan"), 1e-8, 0.0, False,
                                          *scratch)
    for step, (beta1, beta2), call_eps in calls or ():
        optimizer.ds_opt_adam.adam_update(optimizer.opt_id, step, 0.0, beta1, beta2, call_eps, 0.0, False, *scratch)
    generator = torch.Generator().manual_seed(0)
    param, grad, exp_avg, exp_avg_sq = (torch.randn(256, generator=generator) for _ in range(4))
    exp_avg_sq = exp_avg_sq.abs()
    optimizer.ds_opt_adam.adam_update(optimizer.opt_id, next_step, 1e-3, *betas, eps, 0.01, True, param, grad,
                                      exp_avg, exp_avg_sq)
    return torch.cat([param, exp_avg, exp_avg_sq]).view(torch.int32)


@pytest.mark.parametrize("sub_groups", [
    [(LAST, *ADAM)],                                  # one sub-group: every step (a running product)
    [(LAST, *ADAM), (LAST, *ADAM), (LAST, *ADAM)],    # several: one call a step
    [(LAST, *ADAM), (LAST - 10, *ADAM), (LAST, *ADAM)],  # one updated fewer times (a frozen then thawed group)
    [(LAST, *ADAM), (LAST, *OTHER)],                  # param groups with other betas
    [(LAST, *ADAM), (LAST - 1, *ADAM)],               # one at the last step: the whole history
])
def test_the_shortened_replay_leaves_the_products_of_the_whole_history(optimizer, sub_groups):
    calls = step_product_calls(sub_groups)
    assert len(calls) <= len(whole_history(sub_groups))
    for _step, betas, eps in sub_groups:  # the next step's first update, as the resumed run makes it
        assert torch.equal(next_update_after(optimizer, calls, LAST + 1, betas, eps),
                           next_update_after(optimizer, whole_history(sub_groups), LAST + 1, betas, eps))


def test_a_long_run_of_many_sub_groups_replays_one_call_a_step():
    """A resume after 100 000 steps of 70 sub-groups made 7 million C++ calls (about 10 s here)."""
    assert len(step_product_calls([(100_000, *ADAM)] * 70)) == 100_000
    # groups of other betas take turns: each change is a call (pow), as the run made it
    assert len(step_product_calls([(3, *ADAM), (3, *OTHER), (3, *OTHER)])) == 6


def cycled(step):  # a scheduler's betas: beta1 cycled every step (DeepSpeed's OneCycle, torch's OneCycleLR)
    return (0.85 + 0.01 * (step % 5), 0.999)


def changed_once(step):  # beta2 raised once, at step 3
    return (0.9, 0.99 if step < 3 else 0.999)


@pytest.mark.parametrize("betas_at", [cycled, changed_once])
def test_the_recorded_products_give_a_resume_the_uninterrupted_runs_next_update(betas_at):
    """Regression test (helper-222's review): where the betas changed during the run, the replay of the saved step
    counts with the saved betas (the next step's, a scheduler having stepped) left other products than the
    uninterrupted run's; stock CPU offload's fresh ``pow`` gave the right ones. The recorded state replays them."""
    from tencache_ds.integrations.deepspeed.adam_beta_products import (SAVED_KEY, record_beta_products,
                                                                         recorded_products, replay_beta_products)
    base = DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(1))])
    record_beta_products(base)
    scratch = [torch.zeros(64) for _ in range(4)]
    for step in range(1, LAST + 1):  # two sub-groups a step, as stage 3 updates them
        for _ in range(2):
            base.ds_opt_adam.adam_update(base.opt_id, step, 1e-3, *betas_at(step), 1e-8, 0.0, True, *scratch)
    saved = {SAVED_KEY: recorded_products(base).saved()}
    # the uninterrupted run's next update, then a resumed one's (reset, replayed) with the scheduler's next betas
    uninterrupted = next_update_after(base, None, LAST + 1, betas_at(LAST + 1), 1e-8)
    replay_beta_products(base, saved, [])
    assert torch.equal(resumed_update(base, LAST + 1, betas_at(LAST + 1)), uninterrupted)
    # ... which the saved step counts and betas alone did not give (the fallback for checkpoints without the state)
    replay_beta_products(base, {}, [(LAST, betas_at(LAST + 1), 1e-8)] * 2)
    assert not torch.equal(resumed_update(base, LAST + 1, betas_at(LAST + 1)), uninterrupted)


def resumed_update(optimizer, next_step, betas):
    return next_update_after(optimizer, None, next_step, betas, 1e-8)
