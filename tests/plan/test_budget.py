"""Host budgets per node and per process (plan/budget.py, pure): "auto" shares the node's memory between its
ranks; the memlock limit, which is per process, is never divided and always leaves room for the streaming slots."""
import pytest

from tencache_ds.config import TencacheConfig
from tencache_ds.config_checks import check_host_budget
from tencache_ds.errors import TencacheConfigError
from tencache_ds.plan.budget import (AUTO_HOST_CACHE_FRACTION, UNLIMITED, MachineResources, cache_lock_room,
                                     local_world_size, parameter_lock_mode, resolve_budgets)
from tencache_ds.probes import limits
from tencache_ds.probes.limits import LOCAL_WORLD_SIZE_ENVS, ranks_on_node_known

GiB, MiB = 1 << 30, 1 << 20


def node(ranks, available=64 * GiB, memlock=UNLIMITED, total=128 * GiB):
    return MachineResources(host_total_bytes=total, host_available_bytes=available, memlock_limit_bytes=memlock,
                            local_world_size=ranks)


def auto_host(machine, stream_min_bytes=0, locks_memory=True):
    return resolve_budgets(TencacheConfig(), machine, stream_min_bytes=stream_min_bytes,
                           locks_memory=locks_memory).host_cache_bytes


def test_auto_is_shared_by_the_ranks_of_a_node():
    assert auto_host(node(1)) == 16 * GiB
    assert auto_host(node(8)) == 2 * GiB
    # the node's ranks together claim the auto fraction of its memory, not ranks x that fraction
    assert 8 * auto_host(node(8)) <= AUTO_HOST_CACHE_FRACTION * 64 * GiB


def test_local_world_size_comes_from_the_launcher(monkeypatch):
    """torchrun's LOCAL_WORLD_SIZE, the deepspeed launcher's LOCAL_SIZE (it sets no LOCAL_WORLD_SIZE: every rank it
    started counted itself alone until 2026-12-07), Open MPI's; 1 where none is set or none is a number."""
    for name in LOCAL_WORLD_SIZE_ENVS + ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert local_world_size() == 1
    monkeypatch.setenv("LOCAL_SIZE", "2")  # deepspeed --num_gpus 2
    assert local_world_size() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert local_world_size() == 8 and MachineResources.probe().local_world_size == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "garbage")
    assert local_world_size() == 2
    monkeypatch.delenv("LOCAL_SIZE")
    assert local_world_size() == 1


@pytest.mark.parametrize("variables, ranks", [
    ({"MV2_COMM_WORLD_LOCAL_SIZE": "4"}, 4),  # deepspeed --launcher mvapich
    ({"MPI_LOCALNRANKS": "3"}, 3),  # --launcher mpich / impi
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "1"}, 2),  # --launcher slurm (srun)
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}, 1),
    ({"SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_NODEID": "0"}, 8),
    ({"SLURM_STEP_TASKS_PER_NODE": "8"}, 1),  # not understood: alone
    ({"SLURM_STEP_TASKS_PER_NODE": "8(x", "SLURM_NODEID": "0"}, 1),
    ({"SLURM_TASKS_PER_NODE": "8", "SLURM_NODEID": "0"}, 1),  # the allocation's, seen by a batch script too
    # a launch that says nothing of the node (Lightning's subprocess launcher, mp.spawn: LOCAL_RANK and WORLD_SIZE
    # only) is taken for one node: each rank counted itself alone, eight ranks took twice the node (helper-178)
    ({"WORLD_SIZE": "8", "LOCAL_RANK": "3"}, 8),
    ({"WORLD_SIZE": "8", "SLURM_STEP_TASKS_PER_NODE": "2(x4)", "SLURM_NODEID": "0"}, 2),  # srun says more
    ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, 4),
    ({"WORLD_SIZE": "x"}, 1),
])
def test_local_world_size_from_the_other_launchers(monkeypatch, variables, ranks):
    """Regression (helper-156's review): DeepSpeed's slurm and mvapich runners, and MPICH's or Intel MPI's mpirun,
    set none of the variables read before, so every rank counted itself alone on its node ("auto" took its share of
    the node's memory per rank, and the governor's reserve counted one rank's rise)."""
    for name in LOCAL_WORLD_SIZE_ENVS + ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_TASKS_PER_NODE",
                                         "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert local_world_size() == ranks


def test_memlock_is_per_process_and_leaves_the_streaming_slots_their_share():
    # 4 ranks, 16 GiB auto share each, 1 GiB memlock per process, 256 MiB locked for streaming
    machine = node(4, memlock=1 * GiB)
    assert auto_host(machine, stream_min_bytes=256 * MiB, locks_memory=True) == 768 * MiB  # not divided by the 4 ranks
    assert auto_host(machine, stream_min_bytes=2 * GiB) == 0            # streaming alone is over the limit


def test_slots_are_locked_for_an_accelerators_copies_only():
    # a GPU copies asynchronously only from locked pages; DeepSpeed's CPU accelerator copies from nothing
    assert parameter_lock_mode("best_effort", accelerator_is_host=False) == "best_effort"
    assert parameter_lock_mode("best_effort", accelerator_is_host=True) == "off"
    assert parameter_lock_mode("required", accelerator_is_host=True) == "required"  # the user's word stands
    assert parameter_lock_mode("required", accelerator_is_host=False) == "required"


def test_the_memlock_limit_bounds_auto_only_where_slots_are_locked():
    machine = node(1, memlock=1 * GiB)
    assert auto_host(machine, stream_min_bytes=256 * MiB) == 768 * MiB
    assert auto_host(machine, stream_min_bytes=256 * MiB, locks_memory=False) == 16 * GiB


def test_every_caller_says_what_streaming_locks():
    with pytest.raises(TypeError):
        resolve_budgets(TencacheConfig(), node(1))  # pylint: disable=missing-kwoa


def test_an_explicit_budget_above_this_ranks_share_of_available_memory_is_lowered_and_says_why():
    budgets = resolve_budgets(TencacheConfig(host_cache_bytes=10 * GiB), node(8, available=40 * GiB),
                              stream_min_bytes=0, locks_memory=True)
    assert budgets.host_cache_bytes == 5 * GiB and budgets.host_source == "config"
    assert len(budgets.adjustments) == 1 and "8 rank(s)" in budgets.adjustments[0]
    fits = resolve_budgets(TencacheConfig(host_cache_bytes=5 * GiB), node(8, available=40 * GiB), stream_min_bytes=0,
                           locks_memory=True)
    assert fits.host_cache_bytes == 5 * GiB and fits.adjustments == ()


def test_cache_lock_room_subtracts_the_streaming_slots():
    assert cache_lock_room(UNLIMITED, 123) == UNLIMITED
    assert cache_lock_room(1 * GiB, 256 * MiB) == 768 * MiB
    assert cache_lock_room(100 * MiB, 256 * MiB) == 0


def test_ranks_counted_on_the_node_replace_the_guess_from_world_size(monkeypatch):
    """Regression (helper-184's review): where no launcher variable says, WORLD_SIZE is a guess (every node's ranks
    on a multi-node launch): it divides an "auto" share, but refuses no budget and, once the ranks are counted
    (integrations/deepspeed/node_ranks.py), gives way to their count; a launcher's variable still comes first."""
    for name in LOCAL_WORLD_SIZE_ENVS + ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(limits, "_counted_ranks_on_node", None)
    assert ranks_on_node_known() and local_world_size() == 1  # one process
    monkeypatch.setenv("WORLD_SIZE", "64")
    assert local_world_size() == 64 and not ranks_on_node_known()
    machine = MachineResources.probe()
    assert machine.local_world_size == 64 and machine.local_world_size_guessed
    # a budget that fits one node of 8 ranks is not refused for 64
    check_host_budget(TencacheConfig(host_cache_bytes=machine.host_total_bytes // 8), machine)
    with pytest.raises(TencacheConfigError, match="host_cache_bytes"):  # still more than the node on its own
        check_host_budget(TencacheConfig(host_cache_bytes=machine.host_total_bytes + 1), machine)
    limits.note_ranks_on_node(8)
    assert local_world_size() == 8 and ranks_on_node_known() and not MachineResources.probe().local_world_size_guessed
    with pytest.raises(TencacheConfigError, match="x 8 ranks"):
        check_host_budget(TencacheConfig(host_cache_bytes=machine.host_total_bytes // 4), MachineResources.probe())
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # what a launcher says comes first
    assert local_world_size() == 4
