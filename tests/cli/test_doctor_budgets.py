"""doctor's budgets line judges a config's block as the run does (cli/doctor_checks.py): a host budget the run
refuses at initialize is a FAIL here, not an OK line with the budget lowered; and DeepSpeed's older
"zero_optimization": true has no nvme_path to take instead of a traceback."""
from tencache_ds.cli.doctor_checks import FAIL, OK, check_budgets, nvme_path_from_config


def test_a_host_budget_above_the_nodes_memory_fails_as_the_run_refuses_it():
    refused = check_budgets({"tencache": {"host_cache_bytes": "10TiB"}}, device_free_bytes=0, accelerator_is_host=True)
    assert refused.status == FAIL and "tencache.host_cache_bytes = 10995116277760" in refused.message, refused
    taken = check_budgets({"tencache": {"host_cache_bytes": "64MiB"}}, device_free_bytes=0, accelerator_is_host=True)
    assert taken.status == OK and "host_cache_bytes=67108864" in taken.message, taken
    disabled = check_budgets({"tencache": {"enabled": False, "host_cache_bytes": "10TiB"}}, device_free_bytes=0,
                             accelerator_is_host=True)
    assert disabled.status == OK and "stock DeepSpeed" in disabled.message, disabled  # the run checks nothing of it


def test_an_older_zero_optimization_true_has_no_nvme_path():
    assert nvme_path_from_config({"zero_optimization": True}) is None
    on_nvme = {"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": "/x"}}}
    assert nvme_path_from_config(on_nvme) == "/x"
