"""Host memory that shrinks under a running job: the run goes on with stock's bits while tencache gives its host
tier back, or stops between two steps with the numbers; never the OOM killer. Real engine, real files, a real
memory cgroup whose limit tests/deepspeed/memory_squeeze.py lowers mid-run (as a container resize would)."""
import os
import signal
import time
import uuid

import pytest

from test_parity import assert_same_bits  # tests/deepspeed is on sys.path (pytest rootdir-relative imports)
from test_residency import FAST, SUB_GROUPS
from tencache_ds.probes.host_memory import memory_cgroup_folder

# gpt2-tiny with 6 layers: 43 M parameters, 520 MB of optimizer state (master and moments; fp32 gradients stay in
# stage 3's buffer) in 22 sub-groups, so that what "auto"'s start-up share leaves out is more than the streaming
# slots (sized by one sub-group) would hold
DEEPER = dict(SUB_GROUPS, model=os.path.join(os.path.dirname(__file__), "models", "gpt2-tiny-6-layers.json"))

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]

SQUEEZE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memory_squeeze.py")
MiB = 1 << 20
# glibc keeps freed blocks below its dynamic mmap threshold (up to 32 MiB) in its heap, so gpt2-tiny's small
# activations would stay allocated between steps and a step would need no new memory. A fixed 64 KiB threshold
# hands every freed activation back at once, as glibc does for the large activations of a real model: each step
# then rises and falls by what it needs (about 90 MiB here), which is what tencache measures and plans around.
STEPS_THAT_ALLOCATE = {"MALLOC_MMAP_THRESHOLD_": "65536"}


@pytest.fixture
def memory_cgroup():
    """A memory cgroup of its own under this process's, for one training run; removed afterwards."""
    folder, _root, version = memory_cgroup_folder()
    if folder is None:
        pytest.skip("this process sees no memory cgroup (the cgroup file system is not mounted)")
    path = os.path.join(folder, f"tencache-test-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    limit_file = os.path.join(path, "memory.limit_in_bytes" if version == 1 else "memory.max")
    try:
        os.mkdir(path)
        with open(limit_file, "w") as handle:
            handle.write("-1" if version == 1 else "max")
    except OSError as err:
        pytest.skip(f"cannot make a memory cgroup with a limit under {folder} ({err}): needs root and a writable "
                    f"cgroup file system with the memory controller")
    yield path
    for _attempt in range(100):  # the run's processes may take a moment to leave it
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.1)


def test_memory_taken_away_mid_run_is_given_back_then_taken_again_with_stocks_bits(train, memory_cgroup):
    """8 optimizer sub-groups, all held in host memory ("auto"). After step 2 the container's limit drops to what
    the job uses plus less than tencache's reserve (but enough for a step): before step 3 tencache gives back the
    optimizer state it holds beyond the streaming slots one update needs, and the container's working set falls by
    about that much. After step 3 the limit is lifted: before step 4 tencache takes the memory again. Training goes
    on throughout with stock's losses and fp32 weights. Through the deepspeed launcher. Without the reaction the
    working set stays where it was."""
    reference = train(block=None, **SUB_GROUPS)  # 15.2 M parameters: 8 sub-groups of 30 MiB of state
    ours = train(block={}, launcher="deepspeed", script=SQUEEZE, cgroup=memory_cgroup, env=STEPS_THAT_ALLOCATE,
                 squeeze_after=2, squeeze_to="window", release_after=3, **SUB_GROUPS)
    assert_same_bits(reference, ours)
    steps = [step["stats"] for step in ours.result["steps"]]
    assert [stats["host_pressure_shrinks"] for stats in steps] == [0, 0, 0, 1, 1]
    assert [stats["host_pressure_grows"] for stats in steps] == [0, 0, 0, 0, 1]
    # the step rise is measured from each forward pass to the update's start, and from there to the next forward
    # pass (contract.CALL_ORDER: stage 3's step() runs once per optimizer step, between backward and update)
    assert [stats["host_rise_boundaries"] for stats in steps] == [2, 4, 6, 8, 10]
    assert steps[3]["host_memory_bound_by"] == memory_cgroup and "host memory pressure" in ours.output
    given_back = steps[2]["host_cache_bytes_in_use"] - steps[3]["host_cache_bytes_in_use"]
    assert given_back > 100 * MiB, steps[3]  # of about 230 MiB held; the streaming slots take about 90 MiB back
    # ...and the memory went back to the container: its working set after step 3 is lower by most of what was given
    # back less the streaming slots brought back for the sub-groups that now stream (measured: 74 MB of 154 - 83)
    slots_back = steps[2]["optimizer_retired_bytes"] - steps[3]["optimizer_retired_bytes"]
    assert given_back - slots_back > 50 * MiB, (given_back, slots_back)  # else the check below says nothing
    working_sets = ours.result["working_set_bytes"]
    assert working_sets[3] < working_sets[2] - (given_back - slots_back) * 3 // 4, \
        (working_sets, given_back, slots_back)
    # memory back: the tier holds what it held before the squeeze again, with no streaming slots left in use
    assert steps[4]["host_cache_bytes_in_use"] == steps[2]["host_cache_bytes_in_use"]
    assert steps[4]["optimizer_retired_bytes"] == steps[2]["optimizer_retired_bytes"] > 0


def test_a_give_back_of_optimizer_state_leaves_the_owed_fp32_masters_unwritten_with_stocks_bits(train, memory_cgroup):
    """fp32, 8 sub-groups, a 100 MB budget: every parameter partition is held and the masters the optimizer does
    not keep are owed to their files (filled from the partitions, not written). The squeeze after step 2 makes the
    governor give back optimizer state only: no master is written for it (each give-back wrote them all until
    2026-11-30: 5.1 GB on gpt2-1.3b), the partitions stay, and training goes on with stock's losses and fp32
    weights (their files are written at the end, from the partitions, before the weights are read)."""
    reference = train(block=None, **SUB_GROUPS)
    ours = train(block={"host_cache_bytes": "100MB"}, script=SQUEEZE, cgroup=memory_cgroup, env=STEPS_THAT_ALLOCATE,
                 squeeze_after=2, squeeze_to="window", **SUB_GROUPS)
    assert_same_bits(reference, ours)
    steps = [step["stats"] for step in ours.result["steps"]]
    assert [stats["host_pressure_shrinks"] for stats in steps] == [0, 0, 0, 1, 1]
    assert steps[2]["optimizer_masters_owed"] > 0, steps[2]
    assert steps[3]["optimizer_cache_budget_bytes"] < steps[2]["optimizer_cache_budget_bytes"], steps[3]
    assert [stats["optimizer_masters_written_behind"] for stats in steps] == [0] * 5, steps


def test_memory_that_cannot_fit_the_next_step_stops_the_run_with_the_numbers_not_the_oom_killer(train,
                                                                                                 memory_cgroup):
    """Streaming (nothing to give back), and after step 2 the limit leaves half of what a step needs: the run stops
    before step 3 with TencacheOutOfMemory naming the numbers. Without the check the kernel's OOM killer ends the
    process (SIGKILL) in the middle of step 3."""
    failed = train(block={"host_cache_bytes": 0}, script=SQUEEZE, cgroup=memory_cgroup, env=STEPS_THAT_ALLOCATE,
                   squeeze_after=2, squeeze_to="short", steps=4, expect_failure=True, **FAST)
    assert failed.returncode == 1, (failed.returncode, failed.output[-3000:])
    assert failed.returncode != -signal.SIGKILL
    assert "TencacheOutOfMemory: host memory:" in failed.output, failed.output[-3000:]
    assert "can be allocated (page cache included), but a training step needs" in failed.output
    assert memory_cgroup in failed.output
    assert "the engine is between two steps: a checkpoint saved now" in failed.output  # no accumulation here
    assert "step 2 loss" in failed.output and "step 3 loss" not in failed.output


def test_auto_fills_the_memory_a_small_container_leaves_free_with_stocks_bits(train, memory_cgroup):
    """A container too small for "auto"'s start-up share (a quarter of what is available) to hold the optimizer
    state (22 sub-groups, 520 MB of it): once a step has been measured, "auto" grows into what the steps leave free
    and from then on holds all of it (no optimizer-state reads), with stock's bits. With the budget fixed at its
    start-up share it would read part of the state from NVMe every step."""
    reference = train(block=None, **DEEPER)
    ours = train(block={}, script=SQUEEZE, cgroup=memory_cgroup, env=STEPS_THAT_ALLOCATE, limit_at_start="1400MB",
                 **DEEPER)
    assert_same_bits(reference, ours)
    steps = [step["stats"] for step in ours.result["steps"]]
    assert steps[0]["host_memory_bound_by"] == memory_cgroup
    # read, or (an fp32 master) copied from the parameter partitions: not held by the tier (master_copies.py)
    not_held = [stats["optimizer_cache_misses"] + stats["optimizer_cache_copied"] for stats in steps]
    assert not_held[0] > 0  # the start-up share did not hold the state
    assert steps[-1]["host_pressure_grows"] >= 1 and steps[-1]["host_pressure_shrinks"] == 0, steps[-1]
    assert steps[-1]["host_cache_budget_bytes"] > steps[0]["host_cache_budget_bytes"]
    assert not_held[-1] == not_held[-2], steps[-1]  # all held now


def test_auto_keeps_a_single_sub_group_its_streaming_slots_would_hold_anyway_with_stocks_bits(train, memory_cgroup):
    """One optimizer sub-group (240 MiB of state) in the same small container: auto's start-up share is below the
    state, but that share plus the four streaming slots one update needs already cover it, so from the first
    reading tencache keeps all of it (no more memory than streaming it) and reads no optimizer state from NVMe
    after the first step, with stock's bits."""
    reference = train(block=None, steps=4, **FAST)
    ours = train(block={}, script=SQUEEZE, cgroup=memory_cgroup, env=STEPS_THAT_ALLOCATE, limit_at_start="850MB",
                 steps=4, **FAST)
    assert_same_bits(reference, ours)
    steps = [step["stats"] for step in ours.result["steps"]]
    assert steps[0]["host_memory_bound_by"] == memory_cgroup
    assert steps[0]["optimizer_cache_budget_bytes"] >= steps[0]["optimizer_cache_kept_bytes"] > 0, steps[0]
    assert steps[-1]["optimizer_cache_misses"] == steps[1]["optimizer_cache_misses"], steps[-1]  # all held


def test_auto_gives_back_before_the_first_step_what_that_step_is_expected_to_take_with_stocks_bits(train,
                                                                                                   memory_cgroup):
    """The first steps run before any rise is measured. "auto" starts at a quarter of the memory available when
    the model is built; stage 3 then allocates its gradient bucket, and the first backward fills it and reduces it
    through two more copies (43 M parameters, stage 3's default bucket: 166 MiB filled, a rise of 332 MiB
    expected). In a container of the working set + 1200 MB that start-up share left too little: the OOM killer
    ended the first step (measured: cgroup oom_kill 1, also at + 1000 and + 1100 MB; stock NVMe is killed at
    + 1300 MB, its pinned pool being 819 MiB). Now the first reading counts what the first step is expected to
    take (plan/memory_pressure.py ``RisePrior``): it gives the tier back before step 0, and the run trains with
    stock's bits."""
    options = dict(steps=3, sub_group_size=2e6, dtype="fp32", model=DEEPER["model"])
    reference = train(block=None, **options)
    ours = train(block={}, script=SQUEEZE, cgroup=memory_cgroup, env=STEPS_THAT_ALLOCATE, limit_at_start="1200MB",
                 **options)
    assert_same_bits(reference, ours)
    steps = [step["stats"] for step in ours.result["steps"]]
    assert steps[0]["host_memory_bound_by"] == memory_cgroup
    assert steps[0]["host_pressure_shrinks"] >= 1, steps[0]  # at the first reading, before anything was measured
    assert "expected to rise" in ours.output and "(not measured yet), the first one" in ours.output
