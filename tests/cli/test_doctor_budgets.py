"""doctor's budgets line judges a config's block as the run does (cli/doctor_checks.py): a host budget the run
refuses at initialize is a FAIL here, not an OK line with the budget lowered; and DeepSpeed's older
"zero_optimization": true has no nvme_path to take instead of a traceback."""
import os

from tencache_ds.cli.doctor_checks import FAIL, OK, check_budgets, nvme_path_from_config


def test_a_host_budget_above_the_nodes_memory_fails_as_the_run_refuses_it():
    refused = check_budgets({"tencache": {"host_cache_bytes": "10TiB"}}, device_free_bytes=0, accelerator_is_host=True)
    assert refused.status == FAIL and "tencache.host_cache_bytes = 10995116277760" in refused.message, refused
    taken = check_budgets({"tencache": {"host_cache_bytes": "64MiB"}}, device_free_bytes=0, accelerator_is_host=True)
    assert taken.status == OK and "host_cache_bytes=67108864" in taken.message, taken
    disabled = check_budgets({"tencache": {"enabled": False, "host_cache_bytes": "10TiB"}}, device_free_bytes=0,
                             accelerator_is_host=True)
    assert disabled.status == OK and "stock DeepSpeed" in disabled.message, disabled  # the run checks nothing of it


def test_budgets_are_judged_per_rank_of_the_ranks_the_run_starts_on_this_node(monkeypatch):
    """A host budget one rank holds and two do not (helper-244's review: doctor said OK for one rank where `deepspeed
    --num_gpus 2` refuses it); the line says for how many ranks (``--ranks``, else LOCAL_WORLD_SIZE)."""
    from tencache_ds.cli.doctor_checks import local_ranks
    from tencache_ds.plan.budget import MachineResources
    from tencache_ds.probes.limits import LOCAL_WORLD_SIZE_ENVS
    for name in LOCAL_WORLD_SIZE_ENVS + ("SLURM_STEP_TASKS_PER_NODE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    budget = {"tencache": {"host_cache_bytes": int(MachineResources.probe().host_total_bytes * 0.6)}}
    for world_size in (None, "2"):  # also where WORLD_SIZE is set (a job's shell), which makes the probe guess
        if world_size:
            monkeypatch.setenv("WORLD_SIZE", world_size)
        one = check_budgets(budget, device_free_bytes=0, accelerator_is_host=True, ranks=1)
        assert one.status == OK and "per rank of 1 on this node" in one.message, one
        two = check_budgets(budget, device_free_bytes=0, accelerator_is_host=True, ranks=2)
        assert two.status == FAIL and "x 2 ranks on this node" in two.message, two
    assert (local_ranks(0), local_ranks(4)) == (1, 4)  # one per GPU, else one
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert local_ranks(8) == 2  # the GPUs the launcher starts ranks on (helper-245's review: NVML's 8)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3")
    assert local_ranks(8) == 3  # what the launcher said, as the run reads it


def test_an_older_zero_optimization_true_has_no_nvme_path():
    assert nvme_path_from_config({"zero_optimization": True}) is None
    on_nvme = {"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": "/x"}}}
    assert nvme_path_from_config(on_nvme) == "/x"


def test_each_offload_sections_nvme_path_is_named_and_the_measured_one_is_the_optimizers():
    """doctor checks every nvme_path the config names (the optimizer's, in a folder of its own, went unchecked),
    and `estimate --machine this` measures the drive of the config's (it measured the default folder: helper-176)."""
    from tencache_ds.cli.doctor import _other_nvme_paths
    from tencache_ds.cli.estimate import measured_folder
    from tencache_ds.cli.doctor_checks import nvme_paths_from_config
    both = {"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": "/p"},
                                  "offload_optimizer": {"device": "nvme", "nvme_path": "/o"}}}
    assert nvme_paths_from_config(both) == {"zero_optimization.offload_param.nvme_path": "/p",
                                            "zero_optimization.offload_optimizer.nvme_path": "/o"}
    assert measured_folder(None, both, "ds.json") == ("/o", "zero_optimization.offload_optimizer.nvme_path in ds.json")
    assert measured_folder("/x", both, "ds.json") == ("/x", "--nvme-path")
    assert measured_folder(None, {}, "ds.json")[1] == "the default folder: the config names none"
    # the optimizer's folder a file, not a folder: its own FAIL line, where only the parameters' was checked
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        blocker = os.path.join(folder, "a-file")
        open(blocker, "w").close()
        both["zero_optimization"]["offload_param"]["nvme_path"] = folder
        both["zero_optimization"]["offload_optimizer"]["nvme_path"] = blocker
        [line] = _other_nvme_paths(both, "ds.json", os.path.abspath(folder))
        assert line.status == FAIL and "offload_optimizer.nvme_path in ds.json" in line.message
        assert _other_nvme_paths(both, "ds.json", None) == []  # --nvme-path given: only that folder


class VersionsProbe:
    """The doctor's probe (a subprocess that imports torch and DeepSpeed) as check_versions reads it."""

    def __init__(self, deepspeed: str):
        self.deepspeed = deepspeed

    def facts(self):
        return {"versions": {"torch": "2.13.0", "deepspeed": self.deepspeed}}


def test_a_deepspeed_the_run_refuses_fails_and_another_of_its_series_warns():
    """Regression test (helper-206): a DeepSpeed outside 0.19.x, which deepspeed.initialize refuses with an enabled
    block, was a WARN: doctor exited 0 for a run that could not start."""
    from tencache_ds.cli.doctor_checks import WARN, check_versions
    refused = check_versions(VersionsProbe("0.20.1"))
    assert refused.status == FAIL and "supports DeepSpeed 0.19.x" in refused.message, refused
    assert check_versions(VersionsProbe("0.19.3")).status == WARN
    assert check_versions(VersionsProbe("0.19.8")).status == OK
