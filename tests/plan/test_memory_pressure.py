"""The host tier under memory pressure (plan/memory_pressure.py, pure): give back the shortfall, hold inside the
band, take memory back only well above it and never more than was given, and call the run exhausted only when
nothing is left to give and the next step cannot fit."""
import random

import pytest

from tencache_ds.plan.memory_pressure import (RESERVE_FLOOR_MIN_BYTES, STEP_RISE_MARGIN, Action,
                                              MemoryPressurePolicy, RisePrior, stage3_rise_prior)

GiB, MiB = 1 << 30, 1 << 20
TOTAL = 3 * GiB  # floor: max(64 MiB, 2% of 3 GiB = 61 MiB) = 64 MiB


def policy_with_rise(rise, ranks=1):
    policy = MemoryPressurePolicy(ranks)
    policy.observe_step_rise(10 * GiB)  # the first measured step creates the optimizer's state: not counted
    policy.observe_step_rise(rise)
    return policy


def test_the_reserve_is_a_floor_plus_the_measured_step_rise_of_every_rank_on_the_node():
    assert MemoryPressurePolicy().reserve_bytes(TOTAL) == RESERVE_FLOOR_MIN_BYTES  # nothing measured yet
    assert policy_with_rise(200 * MiB).reserve_bytes(TOTAL) == 64 * MiB + int(STEP_RISE_MARGIN * 200 * MiB)
    assert policy_with_rise(200 * MiB, ranks=4).reserve_bytes(TOTAL) == 64 * MiB + int(4 * STEP_RISE_MARGIN * 200 * MiB)
    # on a large node the floor is a share of its memory
    assert MemoryPressurePolicy().reserve_bytes(100 * GiB) == 2 * GiB


def test_before_a_step_is_measured_the_reserve_counts_the_prior_and_the_untouched_memory_the_first_step_takes():
    """Without a prior the reserve was the floor alone through the first two steps: "auto"'s start-up share ran
    the 1.3B model into the OOM killer in its first backward in a 16.5 GiB container where stock trains."""
    policy = MemoryPressurePolicy(prior=RisePrior(rise_bytes=200 * MiB, untouched_bytes=100 * MiB))
    assert policy.step_rise_bytes == 0  # what is reported as measured
    assert policy.reserve_bytes(TOTAL) == 64 * MiB + int(STEP_RISE_MARGIN * 200 * MiB) + 100 * MiB
    assert MemoryPressurePolicy(2, RisePrior(200 * MiB, 100 * MiB)).reserve_bytes(TOTAL) == \
        64 * MiB + 2 * (int(STEP_RISE_MARGIN * 200 * MiB) + 100 * MiB)
    # at the first reading, memory that would do for a step once the bucket is resident is not enough
    decision = policy.decide(TOTAL, 320 * MiB, reducible_bytes=GiB, given_back_bytes=0)
    # up to the reserve, not the band's middle: the prior has its margin, and the band's would outlast it
    assert decision.action is Action.SHRINK and decision.nbytes == policy.reserve_bytes(TOTAL) - 320 * MiB
    assert "expected to rise 200.00 MiB (not measured yet), the first one 100.00 MiB more" in decision.reason
    assert policy.next_step_bytes == 300 * MiB
    policy.reading_done()  # the next reading follows a backward (or, with accumulation, a micro-batch's)
    assert policy.reserve_bytes(TOTAL) == 64 * MiB + int(STEP_RISE_MARGIN * 200 * MiB)  # the bucket is level now
    assert policy.next_step_bytes == 200 * MiB
    policy.observe_step_rise(5 * GiB)  # the first step ran (its rise, the optimizer's state created, is dropped)
    assert policy.reserve_bytes(TOTAL) == 64 * MiB + int(STEP_RISE_MARGIN * 200 * MiB)
    policy.observe_step_rise(120 * MiB)  # measured: the prior is done with
    assert policy.reserve_bytes(TOTAL) == 64 * MiB + int(STEP_RISE_MARGIN * 120 * MiB)
    # growing past the start still waits for a measured rise
    unmeasured = MemoryPressurePolicy(prior=RisePrior(200 * MiB))
    assert unmeasured.decide(TOTAL, 2 * GiB, 0, given_back_bytes=0, growable_bytes=GiB).action is Action.HOLD
    # and nothing is exhausted on a prior
    assert unmeasured.exhausted(TOTAL, MiB, 0, GiB) is None
    # without a prior a shrink before any measurement aims at the band's middle, as it always did
    floor_only = MemoryPressurePolicy().decide(TOTAL, 10 * MiB, reducible_bytes=GiB, given_back_bytes=0)
    assert floor_only.nbytes == int(1.25 * 64 * MiB) - 10 * MiB


def test_the_prior_of_a_zero3_step_on_a_host_accelerator_is_its_bucket_reduced_and_on_a_gpu_the_update():
    """gpt2-1.3b fp32 (5e8-element bucket, a 65.5 M-element embedding, 1e8-element sub-groups) measured a rise of
    3.96 GiB a step; its first backward 5.9 GiB above the memory read before it."""
    model, bucket, embedding, sub_group = 1_276_235_776 * 4, 5 * 10**8 * 4, 65_536_000 * 4, 10**8 * 4
    prior = stage3_rise_prior(True, model, bucket, bucket_allocated=True, around_bytes=embedding,
                              largest_sub_group_bytes=sub_group)
    assert prior == RisePrior(2 * bucket + 2 * embedding, bucket)
    assert 3.96 < prior.rise_bytes / GiB < 1.1 * 3.96 and 5.9 < (prior.rise_bytes + prior.untouched_bytes) / GiB
    assert stage3_rise_prior(True, model, bucket, False, embedding, 0).untouched_bytes == 0  # no contiguous bucket
    assert stage3_rise_prior(False, model, bucket, True, embedding, sub_group) == RisePrior(sub_group)
    # gpt2-small (124 M elements) fills the bucket only at the backward's end: no module is gathered then
    small = stage3_rise_prior(True, 124_439_808 * 4, bucket, True, 38_597_376 * 4, 0)
    assert small == RisePrior(2 * 124_439_808 * 4, 124_439_808 * 4)
    assert abs(small.rise_bytes - 995.5e6) < 0.01 * 995.5e6  # measured


def test_a_reduce_handed_views_keeps_its_buffers_in_the_reserve_however_low_the_measured_rise():
    """At one rank on a host accelerator tencache hands stage 3's reduce views of the gradients
    (integrations/deepspeed/one_rank_reduce.py): gpt2-1.3b then rose 0.44 GiB a step, not 4 GiB. The reserve keeps
    counting the reduce's buffers: grown into them, "auto" left 1 GiB free and the fp32 weights gathered after
    training (5.1 GB) were killed by the kernel. A rise measured above them counts as ever."""
    model, bucket, embedding, sub_group = 1_276_235_776 * 4, 5 * 10**8 * 4, 65_536_000 * 4, 10**8 * 4
    prior = stage3_rise_prior(True, model, bucket, True, embedding, sub_group, bucket_unused=True)
    reduce = 2 * bucket + 2 * embedding
    assert prior == RisePrior(reduce, bucket, kept_rise_bytes=reduce)
    policy = MemoryPressurePolicy(prior=prior)
    policy.reading_done()
    policy.observe_step_rise(5 * GiB)  # the first step: dropped
    policy.observe_step_rise(int(0.44 * GiB))
    assert policy.step_rise_bytes == int(0.44 * GiB)  # what is reported as measured
    assert policy.reserve_bytes(100 * GiB) == 2 * GiB + int(STEP_RISE_MARGIN * reduce)
    shrink = policy.decide(100 * GiB, 2 * GiB, reducible_bytes=GiB, given_back_bytes=0)
    assert "a step rises 450.56 MiB (counted as 4.21 GiB, the buffers of stage 3's own reduce" in shrink.reason
    policy.observe_step_rise(5 * GiB)
    assert policy.reserve_bytes(100 * GiB) == 2 * GiB + int(STEP_RISE_MARGIN * 5 * GiB)
    # the reduce between ranks, or on a GPU, keeps nothing beyond its measured rise
    assert stage3_rise_prior(True, model, bucket, True, embedding, sub_group).kept_rise_bytes == 0
    assert stage3_rise_prior(False, model, bucket, True, embedding, sub_group, bucket_unused=True).kept_rise_bytes == 0


def test_the_first_measured_step_does_not_count_and_the_rise_is_the_most_of_the_last_few():
    policy = MemoryPressurePolicy()
    policy.observe_step_rise(None)  # not measured (the first boundary)
    policy.observe_step_rise(5 * GiB)
    assert policy.step_rise_bytes == 0
    for rise in (100 * MiB, 300 * MiB, 120 * MiB):
        policy.observe_step_rise(rise)
    assert policy.step_rise_bytes == 300 * MiB
    for _ in range(4):
        policy.observe_step_rise(100 * MiB)
    assert policy.step_rise_bytes == 100 * MiB  # the 300 MiB step fell out of the window


def test_plenty_of_memory_holds():
    assert policy_with_rise(200 * MiB).decide(TOTAL, 2 * GiB, 1 * GiB, 0).action is Action.HOLD


def test_a_shortfall_is_given_back_up_to_the_middle_of_the_band():
    policy = policy_with_rise(200 * MiB)  # reserve 64 + 1.25 x 200 = 314 MiB
    decision = policy.decide(TOTAL, 100 * MiB, reducible_bytes=800 * MiB, given_back_bytes=0)
    assert decision.action is Action.SHRINK and decision.nbytes == int(1.25 * (314 * MiB)) - 100 * MiB
    assert "100.00 MiB of 3.00 GiB available" in decision.reason and "gives back 292.50 MiB" in decision.reason


def test_memory_promised_counts_as_taken_and_the_reason_says_what_was_read_and_what_was_promised():
    """The governor counts what the tiers will still fill as taken (integrations/deepspeed/memory_pressure.py
    ``_promised_bytes``). It passed the reading net of it, and the reason then said "-2.82 GiB of 23.54 GiB
    available" (gpt2-2.7b at 2 ranks, 2026-12-06): the reading and the promise are said apart now."""
    policy = policy_with_rise(200 * MiB)
    net = policy.decide(TOTAL, 100 * MiB, reducible_bytes=800 * MiB, given_back_bytes=0)
    promised = policy.decide(TOTAL, 400 * MiB, reducible_bytes=800 * MiB, given_back_bytes=0,
                             promised_bytes=300 * MiB)
    assert (promised.action, promised.nbytes) == (net.action, net.nbytes) == (Action.SHRINK, net.nbytes)
    assert "400.00 MiB of 3.00 GiB available (300.00 MiB of it promised to the optimizer tier's next updates)" \
        in promised.reason, promised.reason
    below_zero = policy.decide(TOTAL, 100 * MiB, reducible_bytes=800 * MiB, given_back_bytes=0,
                               promised_bytes=300 * MiB)
    assert below_zero.action is Action.SHRINK and "-" not in below_zero.reason.split("available")[0]
    grow = policy_with_rise(200 * MiB).decide(TOTAL, 2 * GiB, 1 * GiB, given_back_bytes=1 * GiB,
                                              promised_bytes=100 * MiB)
    assert grow.action is Action.GROW and "(100.00 MiB of it promised" in grow.reason


def test_a_small_shortfall_is_given_back_twice_not_up_to_the_middle_of_the_band():
    """A reading a little short of the reserve gives back as much again as it lacks, not the band's quarter: on
    gpt2-1.3b beyond RAM a reading 10 MiB short gave back 1.45 GiB of the optimizer's 1.5 GiB share."""
    policy = policy_with_rise(200 * MiB)  # reserve 314 MiB, middle 392.5 MiB
    decision = policy.decide(TOTAL, 300 * MiB, reducible_bytes=800 * MiB, given_back_bytes=0)
    assert decision.action is Action.SHRINK and decision.nbytes == 2 * 14 * MiB
    assert "gives back 28.00 MiB" in decision.reason
    # the shortfall where twice it passes the middle: up to the middle
    assert policy.decide(TOTAL, 200 * MiB, 800 * MiB, 0).nbytes == int(1.25 * (314 * MiB)) - 200 * MiB
    # each rank its share of twice the node's shortfall
    four = policy_with_rise(100 * MiB, ranks=4)  # reserve 64 + 4 x 125 = 564 MiB
    assert four.decide(TOTAL, 554 * MiB, GiB, 0).nbytes == -(-(20 * MiB) // 4)


def test_a_shortfall_the_optimizers_state_covers_but_not_twice_is_given_back_from_that_state_alone():
    """Optimizer state goes first; where it covers the shortfall but not twice it, the tier gives only that state (it
    lands inside the band) and the parameter caches stay whole: a cache that gives up a partition ends the fp32
    masters' debt, and every update writes them from then on. Where it does not cover the shortfall, twice it."""
    policy = policy_with_rise(200 * MiB)  # reserve 314 MiB: 14 MiB short at 300 MiB
    assert policy.decide(TOTAL, 300 * MiB, 800 * MiB, 0, optimizer_reducible_bytes=28 * MiB).nbytes == 28 * MiB
    assert policy.decide(TOTAL, 300 * MiB, 800 * MiB, 0, optimizer_reducible_bytes=27 * MiB).nbytes == 27 * MiB
    assert policy.decide(TOTAL, 300 * MiB, 800 * MiB, 0, optimizer_reducible_bytes=14 * MiB).nbytes == 14 * MiB
    assert policy.decide(TOTAL, 300 * MiB, 800 * MiB, 0, optimizer_reducible_bytes=13 * MiB).nbytes == 28 * MiB
    # each rank its share: 20 MiB short on the node, 5 MiB each covers it, 10 MiB each is twice it
    four = policy_with_rise(100 * MiB, ranks=4)  # reserve 564 MiB
    assert four.decide(TOTAL, 544 * MiB, GiB, 0, optimizer_reducible_bytes=7 * MiB).nbytes == 7 * MiB
    assert four.decide(TOTAL, 544 * MiB, GiB, 0, optimizer_reducible_bytes=5 * MiB - 1).nbytes == 10 * MiB
    # on a prior: up to the reserve, as before
    prior = MemoryPressurePolicy(1, RisePrior(200 * MiB))
    assert prior.decide(TOTAL, 300 * MiB, 800 * MiB, 0, optimizer_reducible_bytes=0).nbytes == 14 * MiB


def test_each_rank_of_the_node_gives_back_its_share():
    decision = policy_with_rise(100 * MiB, ranks=4).decide(TOTAL, 50 * MiB, GiB, 0)
    reserve = 64 * MiB + 4 * 125 * MiB
    assert decision.nbytes == -(-(int(1.25 * reserve) - 50 * MiB) // 4)
    assert "this rank's share of 4" in decision.reason


def test_no_more_is_given_back_than_the_tier_can_give():
    decision = policy_with_rise(200 * MiB).decide(TOTAL, 10 * MiB, reducible_bytes=100 * MiB, given_back_bytes=0)
    assert decision.action is Action.SHRINK and decision.nbytes == 100 * MiB
    assert policy_with_rise(200 * MiB).decide(TOTAL, 10 * MiB, 0, 0).action is Action.HOLD


def test_memory_back_is_taken_again_to_the_middle_of_the_band_never_more_than_was_given():
    policy = policy_with_rise(200 * MiB)  # reserve 314 MiB, band [314, 471) MiB, middle 392.5 MiB
    assert policy.decide(TOTAL, 470 * MiB, 0, given_back_bytes=GiB).action is Action.HOLD
    decision = policy.decide(TOTAL, 592 * MiB + MiB // 2, 0, given_back_bytes=GiB)
    assert decision.action is Action.GROW and decision.nbytes == 200 * MiB
    assert policy.decide(TOTAL, 3 * GiB, 0, given_back_bytes=100 * MiB).nbytes == 100 * MiB
    assert policy.decide(TOTAL, 3 * GiB, 0, given_back_bytes=0).action is Action.HOLD


def test_an_auto_budget_fills_what_the_measured_steps_leave_free_up_to_what_it_can_use():
    """A model whose optimizer state does not fit: "auto" started at a safe share, 10 GiB of it could still be
    held. Before a step's rise is measured only the floor is known: nothing is taken. Then it grows to the middle of
    the band, never past what it can use, and an explicit budget (growable 0) never grows past its start."""
    unmeasured = MemoryPressurePolicy()
    assert unmeasured.decide(TOTAL, 2 * GiB, 0, given_back_bytes=0, growable_bytes=10 * GiB).action is Action.HOLD
    policy = policy_with_rise(200 * MiB)  # reserve 314 MiB, middle 392.5 MiB
    decision = policy.decide(TOTAL, 2 * GiB, 0, given_back_bytes=0, growable_bytes=10 * GiB)
    assert decision.action is Action.GROW and decision.nbytes == 2 * GiB - int(392.5 * MiB)
    assert "takes 1.62 GiB" in decision.reason
    assert policy.decide(TOTAL, 2 * GiB, 0, given_back_bytes=0, growable_bytes=300 * MiB).nbytes == 300 * MiB
    assert policy.decide(TOTAL, 2 * GiB, 0, given_back_bytes=-GiB, growable_bytes=0).action is Action.HOLD
    # what was given back is taken back first, then the growth, in one decision
    assert policy.decide(TOTAL, 3 * GiB, 0, given_back_bytes=100 * MiB, growable_bytes=50 * MiB).nbytes == 150 * MiB


def test_inside_the_band_neither_shrinks_nor_grows():
    policy = policy_with_rise(200 * MiB)  # band [314, 471) MiB
    for available in (314 * MiB, 400 * MiB, 470 * MiB):
        assert policy.decide(TOTAL, available, GiB, GiB).action is Action.HOLD


def test_exhausted_only_with_nothing_left_to_give_and_a_step_that_does_not_fit():
    policy = policy_with_rise(200 * MiB)
    assert policy.exhausted(TOTAL, 150 * MiB, 0, GiB) is not None
    assert policy.exhausted(TOTAL, 150 * MiB, 1, GiB) is None   # something to give back first
    assert policy.exhausted(TOTAL, 250 * MiB, 0, GiB) is None   # the step fits (tightly)
    message = policy.exhausted(TOTAL, 150 * MiB, 0, GiB)
    assert "150.00 MiB of 3.00 GiB can be allocated" in message and "200.00 MiB" in message
    assert "OOM killer" in message and "1.00 GiB at start-up" in message
    # before a steady step is measured (the first one only creates the optimizer's state) nothing is exhausted
    fresh = MemoryPressurePolicy()
    fresh.observe_step_rise(2 * GiB)
    assert fresh.exhausted(TOTAL, 1 * MiB, 0, GiB) is None
    assert "x 2 ranks" in policy_with_rise(200 * MiB, ranks=2).exhausted(TOTAL, 150 * MiB, 0, GiB)


@pytest.mark.parametrize("optimizer_share", [False, True], ids=["all-reducible", "optimizer-share-drawn"])
def test_random_pressure_never_oscillates_and_never_takes_back_more_than_it_gave(optimizer_share):
    """A simulated node: other processes' memory moves at random; the tier holds its start budget less what it gave
    back (with ``optimizer_share``, a share of it drawn at random is optimizer state, which goes first). After any
    decision the next reading with unchanged neighbours holds (one decision is enough: no shrink-grow flapping), and
    what it holds stays within [0, start]. Seeded: the same 500 readings every run."""
    rng = random.Random(11 if optimizer_share else 7)
    start, rise = 1 * GiB, 150 * MiB
    policy = policy_with_rise(rise)
    given = 0
    for _ in range(500):
        held = start - given
        others = rng.randrange(0, TOTAL - held + 1)  # what the node's other processes use now
        share = rng.randrange(0, held + 1) if optimizer_share else None
        decision = policy.decide(TOTAL, TOTAL - others - held, held, given, optimizer_reducible_bytes=share)
        shrunk = decision.nbytes if decision.action is Action.SHRINK else 0
        given += shrunk if shrunk else -decision.nbytes
        assert 0 <= given <= start
        held = start - given
        left = None if share is None else max(0, share - shrunk)
        again = policy.decide(TOTAL, TOTAL - others - held, held, given, optimizer_reducible_bytes=left)
        assert again.action is Action.HOLD, (decision, again, others, share)


def test_a_give_back_takes_optimizer_state_first_then_each_parameter_cache_in_turn():
    """The one split the governor applies and the step model replays (HostTierGovernor._give_back and
    _param_cache_targets, plan/step_model/tencache.py _governed_tier)."""
    from tencache_ds.plan.memory_pressure import give_back_split
    MIB = 1 << 20
    assert give_back_split(1024 * MIB, 300 * MIB, [500 * MIB, 500 * MIB]) == (300 * MIB, [500 * MIB, 224 * MIB])
    assert give_back_split(200 * MIB, 300 * MIB, [500 * MIB]) == (200 * MIB, [0])
    assert give_back_split(900 * MIB, 0, [100 * MIB, 0, 500 * MIB]) == (0, [100 * MIB, 0, 500 * MIB])
    assert give_back_split(100 * MIB, -5, [-1]) == (0, [0])  # nothing reducible: nothing cut
