"""The host-tier governor's bookkeeping between steps (integrations/deepspeed/memory_pressure.py, without DeepSpeed:
it only calls the swappers' plain methods): which readings make up an optimizer step's rise."""
import pytest

from tencache_ds.cache.host_budget import HostBudget
from tencache_ds.errors import TencacheOutOfMemory
from tencache_ds.integrations.deepspeed import memory_pressure
from tencache_ds.integrations.deepspeed.memory_pressure import HostTierGovernor
from tencache_ds.memory.footprint import StepRiseMeter
from tencache_ds.probes.host_memory import HostMemory
from tencache_ds.probes import limits
from tencache_ds.probes.limits import LOCAL_WORLD_SIZE_ENVS

GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture(autouse=True)
def no_governor_of_another_test():
    """Every governor of the process counts in a growth (memory_pressure._LIVE_GOVERNORS): one a failed test
    kept alive (its traceback) must not take free memory from the next test's."""
    memory_pressure._LIVE_GOVERNORS.clear()
    yield
    memory_pressure._LIVE_GOVERNORS.clear()


class ScriptedMeter:
    """Stands in for StepRiseMeter: boundary() returns the rises listed, in order (None: the first boundary), and
    notes whether each call closed a span (an optimizer step)."""

    def __init__(self, rises):
        self._rises = list(rises)
        self.spans_ended = []

    def boundary(self, ends_span=False):
        self.spans_ended.append(ends_span)
        return self._rises.pop(0)

    def rebase(self):
        self.rebases = getattr(self, "rebases", 0) + 1

    def close(self):
        pass


def governor_with(rises):
    governor = HostTierGovernor([], None, None, read_memory=lambda: HostMemory(64 * GiB, 48 * GiB))
    governor.meter.close()
    governor.meter = ScriptedMeter(rises)
    return governor


def test_the_first_update_is_left_out_of_the_step_rise_with_gradient_accumulation():
    """Regression test: with 2 micro-batches a step, the reading that covers the optimizer's first update (which
    creates its state, once: 5 GiB here) was counted as the second step's rise, and the reserve stayed 5 GiB too
    large for a few steps. The reading after a step's last backward and update belongs to that step."""
    governor = governor_with([None, 100 * MiB, 5 * GiB, 110 * MiB, 120 * MiB, 90 * MiB, 130 * MiB])
    for step in range(3):
        governor.before_forward()  # micro-batch 0
        governor.before_forward()  # micro-batch 1
        governor.end_optimizer_step()
    governor.before_forward()  # the next step's first reading completes step 2
    assert governor.policy.step_rise_bytes == 130 * MiB  # steps 1 and 2 (120 and 130 MiB); step 0 is left out


def test_the_meter_measures_each_optimizer_step_whole_from_its_first_forward_pass_to_the_next_ones():
    """memory/footprint.py's span: closed at the first reading after an optimizer step, and only there (not at the
    second micro-batch's forward pass, nor where the update starts), so that memory the backward holds until the
    update has begun and the update frees counts in the step's rise (docs/reliability.md, "Two ranks beyond RAM")."""
    governor = governor_with([None, 100 * MiB, 100 * MiB, 2 * GiB, 100 * MiB, 100 * MiB, 2 * GiB])
    for step in range(2):
        governor.before_forward()  # micro-batch 0
        governor.before_forward()  # micro-batch 1
        governor.before_update()
        governor.end_optimizer_step()
    governor.before_forward()
    assert governor.meter.spans_ended == [False, False, False, True, False, False, True]
    assert governor.policy.step_rise_bytes == 2 * GiB  # the second step's (the first is left out)


def test_the_first_update_is_left_out_of_the_step_rise_without_accumulation():
    governor = governor_with([None, 5 * GiB, 200 * MiB, 150 * MiB])
    for step in range(4):
        governor.before_forward()
        governor.end_optimizer_step()
    assert governor.policy.step_rise_bytes == 200 * MiB


class OtherRanks:
    """Stands in for the collective (agreement.agree_min): another rank's values, element-wise minimum with ours."""

    def __init__(self, *theirs):
        self.theirs = list(theirs)  # one list of values per call
        self.calls = []

    def __call__(self, ours):
        self.calls.append(list(ours))
        return [min(a, b) for a, b in zip(ours, self.theirs.pop(0))]


def test_a_rank_whose_memory_is_fine_stops_with_a_rank_that_cannot_go_on():
    """Ranks stop together: this rank's memory is fine, another's is exhausted; stopping here too (with the reason)
    beats going on into a collective the other rank never joins (a hang)."""
    agree = OtherRanks([0], [1 << 62], [-1])  # the other rank: no device-tier proposal, then "I must stop"
    governor = HostTierGovernor([], None, None, read_memory=lambda: HostMemory(64 * GiB, 48 * GiB), agree=agree)
    governor.meter.close()
    governor.meter = ScriptedMeter([None])
    with pytest.raises(TencacheOutOfMemory, match="another rank"):
        governor.before_forward()
    # every rank: past its update before the reading, one device-budget proposal, then one stop vote
    assert agree.calls == [[0], [1 << 62], [0]]


@pytest.mark.parametrize("done, says", [(0, "between two steps: a checkpoint saved now (engine.save_checkpoint) is "
                                             "complete"),
                                         (2, "within a gradient accumulation window (2 of its 4 micro-batches done): a "
                                             "checkpoint saved now (engine.save_checkpoint) holds the last step's "
                                             "weights and optimizer state, not this window's gradients"),
                                         (None, "not the gradients of micro-batches since")])
def test_a_stop_says_what_a_checkpoint_saved_then_holds(done, says):
    """Regression test: a stop at a forward pass in the middle of a gradient accumulation window said a checkpoint
    saved then was complete, though the window's gradients so far are in no checkpoint (helper-148's review)."""
    governor = HostTierGovernor([], None, None, read_memory=lambda: HostMemory(64 * GiB, 48 * GiB),
                                agree=OtherRanks([0], [1 << 62], [-1]))
    governor.meter.close()
    governor.meter = ScriptedMeter([None])
    with pytest.raises(TencacheOutOfMemory) as raised:
        governor.before_forward(micro_batches_done=done, window=4)
    assert says in str(raised.value)
    assert ("is complete" in str(raised.value)) == (done == 0)


def test_ranks_go_on_when_none_must_stop():
    agree = OtherRanks([0], [1 << 62], [0])
    governor = HostTierGovernor([], None, None, read_memory=lambda: HostMemory(64 * GiB, 48 * GiB), agree=agree)
    governor.meter.close()
    governor.meter = ScriptedMeter([None])
    governor.before_forward()
    assert len(agree.calls) == 3


def test_every_rank_is_past_its_update_before_any_reads_the_nodes_memory():
    """Regression test (helper-208's review): with NCCL the update's last collective only queues work, so a rank
    read the node's memory while another still held its update's temporaries (a shrink, then a growth back). A
    collective comes first now, whatever happens on the rank."""
    events = []

    def reading():
        events.append("read")
        return HostMemory(64 * GiB, 48 * GiB)

    def agree(values):
        events.append("agree")
        return values

    governor = HostTierGovernor([], None, None, read_memory=reading, agree=agree)
    governor.meter.close()
    governor.meter = ScriptedMeter([None])
    governor.before_forward()
    assert events[:2] == ["agree", "read"], events


def test_a_rank_whose_own_reading_fails_still_joins_both_collectives_then_raises():
    """Regression test: an error on one rank before the governor's all-reduces (here its memory reading) left the
    other ranks waiting in them. It now joins both with "no proposal" and "stop", then raises its own error."""
    def broken_reading():
        raise OSError("cannot read /proc/meminfo")

    agree = OtherRanks([0], [1 << 62], [0])  # the other rank: fine
    governor = HostTierGovernor([], None, None, read_memory=broken_reading, agree=agree)
    governor.meter.close()
    governor.meter = ScriptedMeter([None])
    with pytest.raises(OSError, match="meminfo"):
        governor.before_forward()
    assert agree.calls == [[0], [1 << 62], [-1]]


def test_a_rank_whose_start_up_plan_fails_still_joins_both_collectives_then_raises():
    """The first reading plans the parameter stores first; that plan failing on one rank (outside the agreement
    until 2026-12-02) left the other ranks waiting in the governor's collectives."""
    class FailingPlan:
        def plan(self):
            raise RuntimeError("no slot fits the largest partition")

    agree = OtherRanks([0], [1 << 62], [0])
    governor = HostTierGovernor([FailingPlan()], None, None, read_memory=lambda: HostMemory(64 * GiB, 48 * GiB),
                                agree=agree)
    governor.meter.close()
    governor.meter = ScriptedMeter([None])
    with pytest.raises(RuntimeError, match="no slot fits"):
        governor.before_forward()
    assert agree.calls == [[0], [1 << 62], [-1]]


class OptimizerStoreSums:
    """The optimizer swapper's footprint methods the governor calls, as plain sums: ``state`` bytes of state in
    all, ``least`` the streaming slots an update needs, ``auto``: the config's host_cache_bytes, ``update_slot``:
    the slot an update lends even when everything is kept (a gradient read from stage 3's buffer)."""

    def __init__(self, state, start, least, auto, update_slot=0):
        self.config = type("Config", (), {"host_cache_bytes": "auto" if auto else start})()
        self.state, self.footprint, self.least, self.update_slot = state, start, least, update_slot
        self.budget = HostBudget(start)
        self.update()

    def update(self):
        """An optimizer update: the tier fills its budget (what it holds is what the budget allows)."""
        self.budget.release(self.budget.used_bytes)
        self.budget.try_reserve(min(self.budget.total_bytes, self.state))

    def state_bytes(self):
        return self.state

    def footprint_keeping_everything_bytes(self):
        return self.state + self.update_slot

    def planned_host_footprint_bytes(self):
        return self.footprint

    def host_footprint_bytes(self):
        return self.footprint

    def least_host_footprint_bytes(self):
        return self.least

    def resize_host_footprint(self, target):
        self.footprint = target
        self.budget.resize(target)


def test_at_two_ranks_a_shrink_counts_the_unfilled_promise_of_every_rank_on_the_node(monkeypatch):
    """Two ranks on the node, each with an 8 GiB optimizer budget no update has filled yet (it fills at the next
    one, on both ranks), 13 GiB available: 13 - 8 leaves the reserve, 13 - 2 x 8 does not. A shrink counted this
    rank's promise alone (a growth counted it as many times as there are ranks), so both ranks held, and their
    updates would have taken 3 GiB more than the node had."""
    class NotFilledYet(OptimizerStoreSums):
        def host_footprint_bytes(self):  # what it holds now: no update has filled its budget
            return self.budget.used_bytes

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    optimizer = NotFilledYet(state=16 * GiB, start=8 * GiB, least=GiB, auto=False)
    optimizer.budget.release(optimizer.budget.used_bytes)  # promised to the next update
    governor = HostTierGovernor([], optimizer, None, read_memory=lambda: HostMemory(64 * GiB, 13 * GiB))
    governor.meter.close()
    governor.meter = ScriptedMeter([None])
    governor.before_forward()
    assert optimizer.footprint < 8 * GiB, optimizer.footprint / GiB


@pytest.mark.parametrize("auto", [True, False])
def test_an_auto_budget_grows_into_free_memory_once_a_step_is_measured_and_an_explicit_one_does_not(auto):
    """16 GiB of optimizer state, 4 GiB held at start-up, 40 GiB of 64 available, steps rising 1 GiB. "auto"
    takes what the measured steps leave free (here everything it can use: 12 GiB more) as soon as one step's rise is
    known: at the third forward pass (the first step's rise, the optimizer creating its state, is not counted); an
    explicit budget stays as configured."""
    optimizer = OptimizerStoreSums(state=16 * GiB, start=4 * GiB, least=GiB, auto=auto)
    governor = HostTierGovernor([], optimizer, None, read_memory=lambda: HostMemory(64 * GiB, 40 * GiB))
    governor.meter.close()
    governor.meter = ScriptedMeter([None, 5 * GiB, GiB, GiB, GiB])
    footprints = []
    for step in range(4):
        governor.before_forward()
        optimizer.update()
        governor.end_optimizer_step()
        footprints.append(optimizer.footprint // GiB)
    assert footprints == ([4, 4, 16, 16] if auto else [4, 4, 4, 4])
    assert governor.grows == (1 if auto else 0) and governor.given_back_bytes == (-12 * GiB if auto else 0)


def test_an_auto_budget_grows_to_the_state_and_the_slot_an_update_still_lends():
    """Gradients read from stage 3's buffer: keeping all 16 GiB of state still takes the 1 GiB slot each update
    fills a gradient into, so growing stops at 17 GiB, not at 16 (where the store would stream instead)."""
    optimizer = OptimizerStoreSums(state=16 * GiB, start=4 * GiB, least=GiB, auto=True, update_slot=GiB)
    governor = HostTierGovernor([], optimizer, None, read_memory=lambda: HostMemory(64 * GiB, 40 * GiB))
    governor.meter.close()
    governor.meter = ScriptedMeter([None, 5 * GiB, GiB, GiB, GiB])
    for _step in range(4):
        governor.before_forward()
        optimizer.update()
        governor.end_optimizer_step()
    assert optimizer.footprint == 17 * GiB and governor.given_back_bytes == -13 * GiB


def test_a_growth_is_not_promised_twice_before_the_update_that_fills_it():
    """Regression test: 100 GiB of state, 40 GiB free, four forward passes (gradient accumulation) before each
    update. The budget grew at every forward pass on the same free memory (4 -> 40 -> 76 -> 100 GiB in one step:
    the memory a growth promises is only allocated at the next update, and no reading shows it before), and the
    update would have met the OOM killer. Now one growth waits for the update that fills it."""
    optimizer = OptimizerStoreSums(state=100 * GiB, start=4 * GiB, least=GiB, auto=True)
    # what is available falls by what the tier holds beyond its start (filled at updates only)
    governor = HostTierGovernor([], optimizer, None,
                                read_memory=lambda: HostMemory(64 * GiB, 44 * GiB - optimizer.budget.used_bytes))
    governor.meter.close()
    governor.meter = ScriptedMeter([None] + [GiB] * 40)
    budgets = []
    for step in range(4):
        for micro in range(4):
            governor.before_forward()
            budgets.append(optimizer.budget.total_bytes)
        optimizer.update()
        governor.end_optimizer_step()
    assert len(set(budgets)) == 2 and max(budgets) < 44 * GiB, [budget / GiB for budget in budgets]
    assert 44 * GiB - optimizer.budget.used_bytes >= governor.policy.reserve_bytes(64 * GiB)  # the reserve stays free


@pytest.mark.parametrize("ranks", [1, 2])
def test_two_engines_do_not_promise_the_same_free_memory(ranks, monkeypatch):
    """Regression test: two engines alive at once in each process (DeepSpeed-Chat's actor and critic), each "auto"
    with 100 GiB of state and 4 GiB held, 44 GiB available, each engine's forward pass before either update (the
    actor's loss, the critic's value, then both backward passes and updates); one rank, or two on the node doing
    the same. Each governor counted only its own promise: at its reading the other's growth was not filled yet, so
    both grew by 40.8 GiB on the same 44 GiB (one rank), and their updates would have taken 38 GiB more than the
    node had (the OOM killer). Every governor's promises count before a growth now, as many times as there are
    ranks on the node (each rank's engines promise alike)."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    actor = OptimizerStoreSums(state=100 * GiB, start=4 * GiB, least=GiB, auto=True)
    critic = OptimizerStoreSums(state=100 * GiB, start=4 * GiB, least=GiB, auto=True)

    def memory():  # what the tiers hold beyond their start is filled at updates only, on every rank alike
        return HostMemory(64 * GiB, 44 * GiB - ranks * (actor.budget.used_bytes + critic.budget.used_bytes - 8 * GiB))

    governors = [HostTierGovernor([], optimizer, None, read_memory=memory) for optimizer in (actor, critic)]
    try:
        for governor in governors:
            governor.meter.close()
            governor.meter = ScriptedMeter([None] + [GiB] * 10)
        for _step in range(4):
            for governor in governors:
                governor.before_forward()
            for optimizer, governor in zip((actor, critic), governors):
                optimizer.update()
                governor.end_optimizer_step()
            assert memory().available_bytes >= governors[0].policy.reserve_bytes(64 * GiB), [
                optimizer.budget.used_bytes / GiB for optimizer in (actor, critic)]
        assert sum(governor.grows for governor in governors) >= 1  # the free memory was used
        assert sum(governor.shrinks for governor in governors) == 0  # and no engine gave any back for the other
    finally:
        for governor in governors:
            governor.close()


class SlotsComeBack(OptimizerStoreSums):
    """A tier that streams: a ``budget`` for kept state beside ``slots`` bytes of streaming slots that come back
    ``per_update`` at a time (as sub-groups first stream, and reads ahead start), not all at start-up."""

    def __init__(self, state, budget, slots, in_use, per_update, come_back=None):
        self.slots, self.slots_in_use, self.per_update = slots, in_use, 0
        self.come_back = slots if come_back is None else come_back  # how many ever come back
        super().__init__(state, start=budget, least=slots, auto=True)
        self.per_update = per_update

    def update(self):
        super().update()
        self.slots_in_use = min(self.come_back, self.slots_in_use + self.per_update)

    def planned_host_footprint_bytes(self):
        return self.budget.total_bytes + self.slots

    def host_footprint_bytes(self):
        return self.budget.used_bytes + self.slots_in_use

    def resize_host_footprint(self, target):
        self.footprint = target
        self.budget.resize(max(0, target - self.slots))


def test_streaming_slots_still_to_come_back_are_not_promised_to_a_growth():
    """Regression test, the 1.3B model beyond this machine's 23.5 GiB (numbers from its run): 15 GiB of optimizer
    state, a 1.6 GiB budget, 3 GiB of streaming slots of which 1.9 GiB had not come back when "auto" grew by 2.4
    GiB at 7.5 GiB available (a step rising 3 GiB): the slots and the growth together took 4.6 GiB, and the next
    reading gave the growth back. Step by step: available = what the rest of the process and node leave, less what
    the tier holds. The slots to come count as taken: no growth is given back, and the reserve stays free."""
    optimizer = SlotsComeBack(state=15 * GiB, budget=int(1.6 * GiB), slots=3 * GiB, in_use=int(0.3 * GiB),
                              per_update=int(0.8 * GiB))
    elsewhere = int(13.4 * GiB)  # the rest of the node's use, between steps
    governor = HostTierGovernor([], optimizer, None, read_memory=lambda: HostMemory(
        int(23.5 * GiB), int(23.5 * GiB) - elsewhere - optimizer.host_footprint_bytes()))
    governor.meter.close()
    governor.meter = ScriptedMeter([None, 5 * GiB] + [3 * GiB] * 8)
    for _step in range(6):
        governor.before_forward()
        assert governor.last_memory.available_bytes >= governor.policy.reserve_bytes(int(23.5 * GiB))
        optimizer.update()
        governor.end_optimizer_step()
    assert optimizer.slots_in_use == optimizer.slots  # every slot came back
    assert governor.shrinks == 0, "a growth was given back"


def test_streaming_slots_that_never_come_back_are_not_promised_forever():
    """Fewer tensors stream at once than the slots planned (part of each sub-group held): half the slots ever come
    back. Once a whole step brings none back the rest count no more, and "auto" grows into the free memory: 5 GiB
    available, a reserve of 2.5 GiB (1 GiB rises); counting the 2 GiB that never come would leave 3 GiB, below the
    3.8 GiB from which it grows."""
    optimizer = SlotsComeBack(state=15 * GiB, budget=2 * GiB, slots=4 * GiB, in_use=GiB, per_update=GiB,
                              come_back=2 * GiB)
    governor = HostTierGovernor([], optimizer, None, read_memory=lambda: HostMemory(
        64 * GiB, 9 * GiB - optimizer.host_footprint_bytes()))
    governor.meter.close()
    governor.meter = ScriptedMeter([None, 5 * GiB] + [GiB] * 8)
    for _step in range(6):
        governor.before_forward()
        optimizer.update()
        governor.end_optimizer_step()
    assert optimizer.slots_in_use == 2 * GiB and governor.grows == 1 and governor.shrinks == 0
    assert optimizer.budget.total_bytes > 2 * GiB  # grown past its start


def test_streaming_slots_beyond_the_least_are_not_given_back_and_an_exhausted_host_stops_the_run():
    """Regression test: 8 GiB of streaming slots brought back where an update needs 4 (no reads ahead, a slow
    drive), and nothing left in the budget. A resize keeps the slots (the store retires them only where it keeps
    everything), but they counted as reducible: every reading "gave back" 4 GiB that were never released, and the
    run went on into the OOM killer instead of stopping with TencacheOutOfMemory between steps."""
    optimizer = SlotsComeBack(state=15 * GiB, budget=0, slots=8 * GiB, in_use=8 * GiB, per_update=0)
    optimizer.least = 4 * GiB
    governor = HostTierGovernor([], optimizer, None, read_memory=lambda: HostMemory(24 * GiB, GiB))
    governor.meter.close()
    governor.meter = ScriptedMeter([None] + [3 * GiB] * 8)
    with pytest.raises(TencacheOutOfMemory, match="nothing more to give back"):
        for _step in range(4):  # (the first step's rise, which creates the optimizer's state, does not count)
            governor.before_forward()
            optimizer.update()
            governor.end_optimizer_step()
    assert governor.given_back_bytes == 0 and governor._optimizer_reducible_bytes() == 0


def test_auto_keeps_all_of_a_state_that_its_budget_and_streaming_slots_would_hold_anyway():
    """One sub-group: a 3 GiB budget beside 2 GiB of streaming slots for a 5 GiB state. Streaming the 2 GiB the
    budget leaves out takes the same memory as keeping it, plus I/O every step: at its first reading "auto" keeps
    all of it (the estimate found gpt2-medium there). An explicit budget stays as configured."""
    for auto in (True, False):
        optimizer = OptimizerStoreSums(state=5 * GiB, start=5 * GiB, least=2 * GiB, auto=auto)
        optimizer.budget.resize(3 * GiB)
        governor = HostTierGovernor([], optimizer, None, read_memory=lambda: HostMemory(64 * GiB, 40 * GiB))
        governor.meter.close()
        governor.meter = ScriptedMeter([None])
        governor.before_forward()
        assert optimizer.budget.total_bytes == (5 * GiB if auto else 3 * GiB), auto


class Resident:
    """This process's anonymous resident bytes as a test sets them, read by a real StepRiseMeter."""

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def __call__(self):
        return self.nbytes


def test_a_backward_rise_is_measured_against_its_own_level_when_the_update_raises_the_level():
    """Regression, from a trace of the 1.3B model beyond this machine's RAM ("auto", fp32; docs/reliability.md,
    memory pressure): each backward rose 3.97 GiB above the level before it, and the second step's update brought
    the optimizer's streaming slots back (the level up 1.9 GiB). Measured over backward and update together, the
    backward's peak stood 2.07 GiB above the level after the update, and "auto" grew into the difference. A
    boundary where the update starts (stage 3's step) keeps the backward's rise whole."""
    resident = Resident(int(12.65 * GiB))
    governor = governor_with([])
    governor.meter = StepRiseMeter(read_resident=resident, interval_s=3600)  # samples taken by the test
    try:
        for level, slots_back in ((12.65, 0.0), (12.75, 1.9)):
            resident.nbytes = int(level * GiB)
            governor.before_forward()
            resident.nbytes = int((level + 3.97) * GiB)  # the backward's peak: gradients, reduce bucket
            governor.meter._take_sample()
            resident.nbytes = int(level * GiB)
            governor.before_update()
            resident.nbytes = int((level + slots_back) * GiB)  # the update brings streaming slots back
            governor.end_optimizer_step()
        governor.before_forward()  # the reading a growth is decided on
        # the first measured step is left out (it creates the optimizer's state); the second rose 3.97 GiB
        assert governor.policy.step_rise_bytes == pytest.approx(3.97 * GiB, rel=0.001)
    finally:
        governor.meter.close()


class _Bucket:
    def __init__(self, buffer):
        self.buffer = buffer


def fake_stage3(numels, bucket_elements, dtype_bytes=4, contiguous=True, sub_groups=(100,), comm_bytes=None):
    """What stage3_prior reads of a built stage 3 optimizer: its parameters (ds_numel), its gradient buckets
    (keyed by ``communication_data_type``, ``comm_bytes``: the parameters' by default; their buffers allocated
    with contiguous_gradients), ``reduce_bucket_size`` and its sub-groups' sizes."""
    import types
    import torch
    dtype = {4: torch.float32, 2: torch.bfloat16}[dtype_bytes]
    comm_dtype = {4: torch.float32, 2: torch.bfloat16}[comm_bytes or dtype_bytes]
    params = []
    for numel in numels:
        param = torch.empty(0, dtype=dtype)
        param.ds_numel = numel
        params.append(param)
    buckets = {comm_dtype: _Bucket(torch.empty(bucket_elements, dtype=comm_dtype) if contiguous else None)}
    return types.SimpleNamespace(fp16_groups=[params], ipg_buckets=buckets, reduce_bucket_size=bucket_elements,
                                 fp16_partitioned_groups_flat_numel=list(sub_groups))


def test_the_prior_comes_from_stage_3s_bucket_parameters_and_sub_groups():
    from tencache_ds.plan.memory_pressure import RisePrior
    stage3 = fake_stage3([1000, 300, 5000], bucket_elements=4000, sub_groups=(2000, 4300))
    # the bucket fills 4000 of the 6300 elements: reduced through two copies, beside two of the largest parameter
    assert memory_pressure.stage3_prior(stage3, True) == RisePrior(2 * 4000 * 4 + 2 * 5000 * 4, 4000 * 4)
    # a model smaller than the bucket fills it with all of it, at the backward's end; bf16 gradients: half the bytes
    small = fake_stage3([1000, 300], bucket_elements=10**6, dtype_bytes=2)
    assert memory_pressure.stage3_prior(small, True) == RisePrior(2 * 1300 * 2, 1300 * 2)
    # without contiguous_gradients no bucket is allocated: nothing untouched
    assert memory_pressure.stage3_prior(fake_stage3([1000], 10**6, contiguous=False), True).untouched_bytes == 0
    # bf16 gradients reduced in fp32 (communication_data_type): the reduce concatenates their fp32 casts, bucket
    # or not, as the step model prices it (plan/workload.communication_bytes); without a bucket the prior took the
    # parameters' 2 bytes until 2026-11-30
    for contiguous in (True, False):
        cast = fake_stage3([1000, 300], bucket_elements=10**6, dtype_bytes=2, contiguous=contiguous, comm_bytes=4)
        assert memory_pressure.stage3_prior(cast, True).rise_bytes == 2 * 1300 * 4
    # on a GPU the host sees the update's temporaries: the largest sub-group in fp32
    assert memory_pressure.stage3_prior(stage3, False) == RisePrior(4300 * 4)
    # one rank on a host accelerator: the reduce is handed views (one_rank_reduce.py) and takes no buffers, which
    # the reserve keeps counting however low the measured rise (plan/memory_pressure.py, kept_rise_bytes)
    reduce = 2 * 4000 * 4 + 2 * 5000 * 4
    assert memory_pressure.stage3_prior(stage3, True, bucket_unused=True) == RisePrior(reduce, 4000 * 4, reduce)


class ParamCacheSums:
    """A parameter swapper whose store's cache slots the governor can resize (``bytes`` of them, all retirable)."""

    def __init__(self, nbytes):
        store = type("Store", (), {})()
        store.cache_bytes_reserved = store.reducible_cache_bytes = store.planned_cache_bytes = nbytes

        def resize_cache(target):
            store.cache_bytes_reserved = store.reducible_cache_bytes = target
            return target
        store.resize_cache = resize_cache
        self.store = store

    def plan(self):
        pass


def first_reading(param_swappers, optimizer, prior, available):
    """A governor's first reading, before any step, with ``available`` bytes of 64 GiB and this ``prior``."""
    governor = HostTierGovernor(param_swappers, optimizer, None,
                                read_memory=lambda: HostMemory(64 * GiB, available),
                                agree=lambda values: values, prior=prior)
    governor.meter.close()
    governor.meter = ScriptedMeter([None])
    governor.before_forward()
    return governor


def test_the_first_reading_gives_back_what_the_first_step_is_expected_to_take():
    """Before any step is measured the reserve counts the prior (a 2 GiB rise, a 1 GiB bucket untouched): with 4
    GiB available of 64 the first reading gives back, where without the prior the reserve was the floor alone and
    the tier kept its start-up share into the first backward (the 1.3B model was OOM-killed there in a 16.5 GiB
    container)."""
    from tencache_ds.plan.memory_pressure import RisePrior
    for prior, gives_back in ((RisePrior(), False), (RisePrior(2 * GiB, 1 * GiB), True)):
        swapper = ParamCacheSums(3 * GiB)
        governor = first_reading([swapper], None, prior, 4 * GiB)
        assert (governor.shrinks == 1) is gives_back
        # the step after a give-back rises from the level after it (memory/footprint.py rebase)
        assert getattr(governor.meter, "rebases", 0) == (1 if gives_back else 0)
        # the bucket is resident from the first backward on: the next reading (with gradient accumulation, the
        # first step's second micro-batch) sees it in its memory, and the reserve no longer counts it
        assert governor.policy.untouched_bytes == 0
        if gives_back:  # up to the reserve (on a prior): 1.28 GiB floor + 1.25 x 2 GiB + 1 GiB, less the 4 GiB
            reserve = int(0.02 * 64 * GiB) + int(1.25 * 2 * GiB + 1 * GiB)
            assert swapper.store.cache_bytes_reserved == 3 * GiB - (reserve - 4 * GiB)


class NotFilledYet:
    """An optimizer store before its first update: a budget of ``budget`` bytes planned beside ``slots`` bytes of
    streaming slots, nothing held and no slot in use yet (``explicit``: the config's budget, else "auto")."""

    def __init__(self, budget, slots, state, explicit):
        self.config = type("Config", (), {"host_cache_bytes": budget if explicit else "auto"})()
        self.budget, self.slots, self.state = HostBudget(budget), slots, state
        self.resized_to = None

    def state_bytes(self):
        return self.state

    def footprint_keeping_everything_bytes(self):
        return self.state

    def planned_host_footprint_bytes(self):
        return self.budget.total_bytes + self.slots

    def host_footprint_bytes(self):
        return self.budget.used_bytes  # no slot in use

    def least_host_footprint_bytes(self):
        return self.slots

    def resize_host_footprint(self, target):
        self.resized_to = target
        self.budget.resize(max(0, target - self.slots))


@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "explicit"])
def test_the_first_reading_cuts_the_optimizer_budget_not_filled_yet_before_parameter_cache_slots(explicit):
    """At the first reading the optimizer holds nothing of what it is set to fill (no update has run): that counts
    as taken, and giving back cuts it first, as it would the state once held. It took parameter cache slots
    instead, and on gpt2-1.3b beyond RAM ("auto", 23 GiB) the first reading retired 2.1 GiB of them, never taken
    again: 43 s a step instead of 31 s (docs/bench/gpt2-1.3b-auto-2026-11-29-first-reading-took-param-cache). An
    explicit budget's fill counted as taken only for "auto" before: cutting it then freed nothing the reading had
    seen."""
    from tencache_ds.plan.memory_pressure import RisePrior
    swapper = ParamCacheSums(3 * GiB)
    optimizer = NotFilledYet(budget=3 * GiB // 2, slots=GiB // 2, state=16 * GiB, explicit=explicit)
    reserve = int(0.02 * 64 * GiB) + int(1.25 * 2 * GiB + 1 * GiB)  # 4.78 GiB
    # 2 GiB of the reading are the optimizer's to fill: 1 GiB short of the reserve
    first_reading([swapper], optimizer, RisePrior(2 * GiB, 1 * GiB), reserve + GiB)
    assert optimizer.resized_to == GiB  # 1 GiB of its planned 2 GiB
    assert swapper.store.cache_bytes_reserved == 3 * GiB  # untouched


def test_a_measured_shortfall_the_optimizers_state_covers_leaves_the_parameter_cache_whole():
    """With a measured rise: a reading 600 MiB short, with 1 GiB of optimizer state to give, gives that 1 GiB (not
    twice the shortfall, which would take 200 MiB of cache slots): the parameter cache whole. The next reading 100
    MiB short, with no optimizer state left, takes twice that from the cache."""
    optimizer = OptimizerStoreSums(state=16 * GiB, start=2 * GiB, least=GiB, auto=False)
    swapper = ParamCacheSums(3 * GiB)
    available = [40 * GiB]
    governor = HostTierGovernor([swapper], optimizer, None, read_memory=lambda: HostMemory(64 * GiB, available[0]),
                                agree=lambda values: values)
    governor.meter.close()
    governor.meter = ScriptedMeter([None, 5 * GiB, GiB, GiB, GiB])
    for _step in range(3):  # the second step's rise is the first kept
        governor.before_forward()
        optimizer.update()
        governor.end_optimizer_step()
    reserve = governor.policy.reserve_bytes(64 * GiB)
    available[0] = reserve - 600 * MiB
    governor.before_forward()
    assert optimizer.footprint == GiB and swapper.store.cache_bytes_reserved == 3 * GiB
    optimizer.update()  # the step's update holds what its smaller budget allows
    governor.end_optimizer_step()
    available[0] = reserve - 100 * MiB
    governor.before_forward()
    assert swapper.store.cache_bytes_reserved == 3 * GiB - 200 * MiB


def test_the_device_tiers_budget_counts_the_prior_before_a_rise_is_measured():
    """On the CPU accelerator at several ranks the device tier is host memory of its own, sized by the node's
    available memory less a step's rise: before one is measured that is the prior (and the bucket the first
    backward fills), not 0, which let the tier take the memory the reserve kept for the first backward."""
    from tencache_ds.plan.memory_pressure import RisePrior

    class Coordinator:
        tier, swapper, gathers_alias_partitions = object(), object(), False

        def __init__(self):
            self.rises = []

        def propose_device_budget(self, capacity, step_rise_bytes=0):
            self.rises.append(step_rise_bytes)
            return GiB

        def apply_device_budget(self, budget):
            pass

    for prior, rise in ((RisePrior(), 0), (RisePrior(2 * GiB, GiB), 3 * GiB)):
        coordinator = Coordinator()
        governor = HostTierGovernor([], None, coordinator, read_memory=lambda: HostMemory(64 * GiB, 48 * GiB),
                                    agree=lambda values: values, prior=prior)
        governor.meter.close()
        governor.meter = ScriptedMeter([None, None])
        governor.before_forward()
        governor.before_forward()  # the bucket is resident by the next reading
        assert coordinator.rises == [rise, rise - prior.untouched_bytes]


def test_the_reserve_counts_no_ranks_guessed_from_world_size(monkeypatch):
    """Regression (helper-184's review): WORLD_SIZE alone (a launcher that says nothing of the node) is every node's
    ranks; the reserve counted 64 step rises on each node of a 64-rank job, gave back the whole tier and stopped the
    run. Guessed, it counts this rank; counted on the node (node_ranks.py), the ranks counted."""
    for name in LOCAL_WORLD_SIZE_ENVS + ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "64")
    monkeypatch.setattr(limits, "_counted_ranks_on_node", None)
    optimizer = OptimizerStoreSums(state=16 * GiB, start=4 * GiB, least=GiB, auto=False)
    for counted, ranks in ((None, 1), (8, 8)):
        if counted is not None:
            limits.note_ranks_on_node(counted)
        governor = HostTierGovernor([], optimizer, None, read_memory=lambda: HostMemory(64 * GiB, 40 * GiB))
        governor.close()
        assert governor.policy.ranks == ranks


def test_a_give_back_whose_resize_raises_keeps_count_of_what_was_cut():
    """Regression (helper-184's review): the optimizer's target was cut, then the parameter cache's resize raised
    (a victim's write failed, Ctrl-C): nothing was counted given back, so the cut could never be taken back."""
    optimizer = OptimizerStoreSums(state=16 * GiB, start=8 * GiB, least=GiB, auto=False)
    swapper = ParamCacheSums(3 * GiB)

    def failing_resize(target):
        raise OSError(28, "No space left on device")
    swapper.store.resize_cache = failing_resize
    governor = HostTierGovernor([swapper], optimizer, None, read_memory=lambda: HostMemory(64 * GiB, 40 * GiB))
    governor.close()
    with pytest.raises(OSError):
        governor._give_back(9 * GiB)  # 7 GiB of optimizer state above its least, then the parameter cache's
    assert optimizer.footprint == GiB
    assert governor.given_back_bytes == 7 * GiB and governor.shrinks == 1


class OptimizerWithSlots:
    """An optimizer store whose footprint is its budget's bytes plus its streaming slots, which can come back beyond
    the least (no reads ahead, a slow drive): ``resize_host_footprint`` gives the budget what the slots leave."""

    def __init__(self, budget, least):
        self.config = type("Config", (), {"host_cache_bytes": budget})()
        self.slots, self.least = least, least
        self.budget = HostBudget(budget)
        self.budget.try_reserve(budget)

    def state_bytes(self):
        return 64 * GiB

    def footprint_keeping_everything_bytes(self):
        return 64 * GiB

    def planned_host_footprint_bytes(self):
        return self.budget.total_bytes + self.least

    def host_footprint_bytes(self):
        return self.budget.used_bytes + self.slots

    def least_host_footprint_bytes(self):
        return self.least

    def resize_host_footprint(self, target):
        self.budget.resize(max(0, target - self.slots))
        self.budget.release(max(0, self.budget.used_bytes - self.budget.total_bytes))


def test_taking_memory_back_never_lowers_the_optimizers_budget_after_its_slots_grew():
    """Regression test (helper-208's review): the optimizer's target was the footprint last set; streaming slots
    brought back beyond the least since then are in what the resize subtracts, so taking back less than them
    lowered the budget (here 1 GiB to 0.5) while the governor counted it taken."""
    optimizer = OptimizerWithSlots(budget=3 * GiB, least=GiB)
    governor = HostTierGovernor([], optimizer, None, read_memory=lambda: HostMemory(64 * GiB, 40 * GiB))
    governor.meter.close()
    governor._start()
    governor._give_back(2 * GiB)
    assert optimizer.budget.total_bytes == GiB
    optimizer.slots = 2 * GiB  # a slow drive: one more slot came back
    governor._take(GiB // 2)
    assert optimizer.budget.total_bytes >= GiB


def test_the_step_rise_expected_is_left_for_a_device_tier_made_between_readings():
    """Regression test (helper-218's review): the device tier is made when the coordinator's trace completes,
    between the governor's refits, and was sized with no room for the step's rise (the CPU accelerator at 2 ranks:
    the gathered parameters are host memory). The governor leaves the rise it expects on the coordinator."""
    import types
    coordinator = types.SimpleNamespace(tier=None)
    governor = HostTierGovernor([], None, coordinator, read_memory=lambda: HostMemory(64 * GiB, 48 * GiB),
                                agree=lambda values: values)
    governor.meter.close()
    governor.meter = ScriptedMeter([None])
    governor.before_forward()
    assert coordinator.step_rise_hint_bytes == governor.policy.next_step_bytes


def test_every_rank_keeps_room_for_the_largest_step_rise_any_rank_expects():
    """Regression test (helper-229's review): each rank's reserve counted its own step rise for every rank of its
    node; a rank whose rise was small (1 GiB) grew into the room another rank's larger rise (3 GiB: rank 0's 16-bit
    save) needed, and that rank gave its tier back reading after reading until it stopped the job. The first
    collective of each reading carries the largest rise any rank expects, and every rank sharing a node reserves it
    for each rank there, the same reserve on all of them; a rank alone on its node, its own (helper-232)."""
    agree = OtherRanks(*[[-3 * GiB], [1 << 62], [0]] * 4)
    governor = HostTierGovernor([], None, None, read_memory=lambda: HostMemory(64 * GiB, 48 * GiB), agree=agree)
    governor.policy.ranks = 2  # two ranks on this node
    governor.meter.close()
    governor.meter = ScriptedMeter([None, 5 * GiB, GiB, GiB])
    for _ in range(4):
        governor.before_forward()
        governor.end_optimizer_step()
    assert governor.policy.step_rise_bytes == GiB  # its own
    assert agree.calls[-3] == [-GiB]  # what it says it expects, to the others
    from tencache_ds.plan.memory_pressure import (RESERVE_FLOOR_FRACTION, RESERVE_FLOOR_MIN_BYTES, STEP_RISE_MARGIN,
                                                  MemoryPressurePolicy)
    floor = max(RESERVE_FLOOR_MIN_BYTES, int(64 * GiB * RESERVE_FLOOR_FRACTION))
    # the node's: the largest, the other rank's 3 GiB, for both, as the other rank reserves it (helper-233: the
    # other's once beside this one's own, 4 GiB, left the rank with the largest rise reserving more than the others,
    # which took what it gave back)
    assert governor.policy.reserve_bytes(64 * GiB) == floor + int(STEP_RISE_MARGIN * 6 * GiB)
    other = MemoryPressurePolicy(2)
    for rise in (5 * GiB, 3 * GiB):
        other.observe_step_rise(rise)
    other.agreed_rise_bytes = 3 * GiB
    assert other.reserve_bytes(64 * GiB) == governor.policy.reserve_bytes(64 * GiB)
    governor.policy.ranks = 1  # alone on its node: a larger rise is another node's
    assert governor.policy.reserve_bytes(64 * GiB) == floor + int(STEP_RISE_MARGIN * GiB)
