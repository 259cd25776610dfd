"""`tencache-ds estimate` as a user runs it (a fresh interpreter): the report's lines and JSON keys, the frozen option
set, and the errors for bad inputs, each naming the file and the key. Machine files only (fast); `--machine this`
measures the machine and is marked slow."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tencache_ds.cli.main import build_parser
from tencache_ds.io import drive_rate

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MACHINE = os.path.join(REPO_ROOT, "configs", "machines", "h100x1-2nvme-gen4.json")
DS_CONFIG = os.path.join(REPO_ROOT, "configs", "zero-infinity-nvme.json")
OPTIONS = ["--activation-checkpointing", "--drive-tbw", "--ds-config", "--gas", "--help", "--json", "--machine",
           "--micro-batch", "--model", "--nvme-path", "--profile", "--save-machine", "--seq", "-h"]
JSON_KEYS = {"fits", "needs", "budgets", "step_time_s", "nvme_read_bytes_per_step", "nvme_write_bytes_per_step",
             "bottleneck", "drive_days_to_tbw"}


def run_cli(*args, timeout=120, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", "from tencache_ds.cli.main import main; main()", *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def estimate(*extra, model="llama-7b", machine=MACHINE, ds_config=DS_CONFIG):
    return run_cli("estimate", "--model", model, "--ds-config", ds_config, "--machine", machine, *extra)


def test_the_option_set_is_frozen():
    parser = build_parser()
    subparsers = next(action for action in parser._actions if action.dest == "command")
    options = sorted(flag for action in subparsers.choices["estimate"]._actions for flag in action.option_strings)
    assert options == sorted(OPTIONS)


def test_the_report_says_fits_needs_budgets_times_and_wear_in_at_most_15_lines():
    result = estimate("--seq", "2048", "--gas", "8")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) <= 15, result.stdout
    text = result.stdout
    for expected in ("fits (tencache): yes", "needs per rank (tencache): device", "budgets (tencache): host tier",
                     "step time: stock", "bottleneck", "NVMe per step and rank", "days of training to each drive"):
        assert expected in text, (expected, text)
    assert "Traceback" not in result.stdout + result.stderr


def test_json_carries_the_keys_the_issue_lists():
    result = estimate("--json", "--seq", "2048", "--gas", "8")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert JSON_KEYS <= set(report)
    assert isinstance(report["fits"], bool) and set(report["step_time_s"]) == {"stock", "tencache"}
    assert set(report["needs"]) == {"device", "pinned", "pageable", "nvme"}
    assert report["step_time_s"]["tencache"] < report["step_time_s"]["stock"]
    assert report["drive_days_to_tbw"]["stock"] > 0  # the machine file's rating: the PM9A3's 9.1 PB


def test_a_model_that_runs_out_of_memory_does_not_fit():
    """Llama-70B without activation checkpointing: ~1.9 GB of activations per block x 80 blocks on an 80 GB H100."""
    report = json.loads(estimate("--json", "--seq", "2048", model="llama-70b").stdout)
    assert report["fits"] is False and any("accelerator memory" in r for r in report["why_not"]["tencache"])
    report = json.loads(estimate("--json", "--seq", "2048", "--activation-checkpointing", model="llama-7b").stdout)
    assert report["fits"] is True


def test_a_policy_that_does_not_fit_is_priced_but_marked_and_a_config_without_nvme_has_no_budgets():
    """Until 2026-12-02 the text gave stock's step and a speed-up over it for a config the line above said stock
    refuses at init, and a config that offloads nothing to NVMe (stock's own prediction standing in for tencache's,
    which has no budgets) stopped on a KeyError traceback."""
    text = estimate(ds_config=os.path.join(REPO_ROOT, "configs", "stock-nvme.json")).stdout  # buffer_size 4e7
    assert "fits (stock): NO" in text and "(does not fit), tencache" in text and "x); bottleneck" not in text
    result = estimate(ds_config=os.path.join(REPO_ROOT, "configs", "stock-cpu.json"), model="gpt2-tiny")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "budgets (tencache): none: nothing is offloaded to NVMe" in result.stdout
    assert "(1.00x); bottleneck" in result.stdout  # both fit: the ratio is given


def test_a_disabled_block_is_priced_with_a_word_that_the_run_would_be_stock(tmp_path):
    """"tencache": {"enabled": false}: the run is stock DeepSpeed's. The estimate still prices tencache (what
    enabling it would give), and says so, as doctor does (helper-244's review: it said nothing)."""
    with open(DS_CONFIG) as handle:
        config = json.load(handle)
    config["tencache"] = {"enabled": False}
    path = tmp_path / "disabled.json"
    path.write_text(json.dumps(config))
    result = estimate(ds_config=str(path))
    assert result.returncode == 0, result.stderr
    assert "block has enabled false, so the run would be stock DeepSpeed's" in result.stdout.splitlines()[0]
    assert "enabled false" not in estimate().stdout


def test_a_config_deepspeed_refuses_does_not_fit_either_arm(tmp_path):
    """A misspelt key (DeepSpeed's models forbid unknown keys): deepspeed.initialize stops for stock and tencache
    alike (helper-244's review: "fits: yes" for both, priced at DeepSpeed's default sub_group_size)."""
    with open(DS_CONFIG) as handle:
        config = json.load(handle)
    config["zero_optimization"]["sub_group_sise"] = 2000000
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(config))
    report = json.loads(estimate("--json", ds_config=str(path)).stdout)
    assert report["fits"] is False and report["fits_stock"] is False
    for arm in ("stock", "tencache"):
        assert any("sub_group_sise is not a key of DeepSpeed's (did you mean sub_group_size?)" in reason
                   for reason in report["why_not"][arm]), report["why_not"]


def test_a_hugging_face_trainer_config_has_its_auto_sizes_filled_as_the_trainer_fills_them(tmp_path):
    """The Trainer's documented ZeRO-3 config leaves the bucket sizes and the persistence threshold "auto" (filled
    at launch from the model's hidden size: transformers' trainer_config_finalize) and the batch sizes too: the
    estimate fills them as the Trainer does, says so, and prices them (until 2026-12-08: refused on the first
    "auto"); a precision left "auto" (the Trainer's --bf16) is refused naming its key."""
    with open(DS_CONFIG) as handle:
        config = json.load(handle)
    zero = config["zero_optimization"]
    for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
        zero[key] = "auto"
    config.update(train_micro_batch_size_per_gpu="auto", gradient_accumulation_steps="auto", train_batch_size="auto")
    path = tmp_path / "hf.json"
    path.write_text(json.dumps(config))
    result = estimate("--json", ds_config=str(path), model="gpt2-small")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["filled"] == [
        "\"auto\" filled as Hugging Face's Trainer fills it from the model's hidden size 768: reduce_bucket_size "
        "589824, stage3_prefetch_bucket_size 530841, stage3_param_persistence_threshold 7680"]
    zero.update(reduce_bucket_size=589824, stage3_prefetch_bucket_size=530841, stage3_param_persistence_threshold=7680)
    written = tmp_path / "written.json"
    written.write_text(json.dumps(config))
    filled = json.loads(result.stdout)
    assert filled["step_time_s"] == json.loads(estimate("--json", ds_config=str(written), model="gpt2-small")
                                               .stdout)["step_time_s"]  # priced as the config the Trainer hands on
    config["bf16"] = {"enabled": "auto"}
    path.write_text(json.dumps(config))
    refused = estimate(ds_config=str(path), model="gpt2-small")
    assert refused.returncode != 0 and 'bf16.enabled is "auto"' in refused.stderr, refused.stderr


def test_drive_tbw_overrides_the_machine_file():
    days = json.loads(estimate("--json", "--drive-tbw", "1PB").stdout)["drive_days_to_tbw"]["stock"]
    default = json.loads(estimate("--json").stdout)["drive_days_to_tbw"]["stock"]
    assert days == pytest.approx(default * 1e15 / (3.84e12 * 1.3 * 365 * 5), rel=1e-3)


def test_null_days_to_the_rating_are_told_apart_by_the_fields_beside_them(tmp_path):
    """JSON has no infinity: days are null where nothing is written (that policy writes 0 bytes a step) and where
    there is no rating (``drive_tbw_bytes`` null); docs/estimate.md says how to tell them apart."""
    never = json.loads(estimate("--json", ds_config=os.path.join(REPO_ROOT, "configs", "stock-cpu.json"),
                                model="gpt2-tiny").stdout)
    assert never["drive_days_to_tbw"] == {"stock": None, "tencache": None} and never["drive_tbw_bytes"] > 0
    assert never["nvme_write_bytes_per_step"] == {"stock": 0, "tencache": 0}
    with open(MACHINE) as handle:
        machine = json.load(handle)
    machine["drive_tbw_bytes"] = None
    unrated = tmp_path / "unrated.json"
    unrated.write_text(json.dumps(machine))
    report = json.loads(estimate("--json", machine=str(unrated)).stdout)
    assert report["drive_days_to_tbw"] == {"stock": None, "tencache": None} and report["drive_tbw_bytes"] is None
    assert report["nvme_write_bytes_per_step"]["stock"] > 0


def test_save_machine_without_a_measured_machine_or_into_a_missing_folder_is_refused_before_anything(tmp_path):
    """--save-machine saves what --machine this measures: with a machine file it was ignored without a word; into a
    folder that does not exist it failed with a traceback after a minute of measuring."""
    saved = tmp_path / "m.json"
    result = estimate("--save-machine", str(saved))
    assert result.returncode == 2 and "--save-machine saves the machine `--machine this` measures" in result.stderr
    assert not saved.exists() and "Traceback" not in result.stderr
    nowhere = tmp_path / "missing" / "m.json"
    result = estimate("--save-machine", str(nowhere), machine="this")
    assert result.returncode == 2 and f"--save-machine {nowhere} cannot be written" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("rating", ["nanTB", "infPB", "0TB", "0"])
def test_a_drive_rating_that_is_no_positive_finite_number_is_refused_naming_it(rating):
    result = estimate("--drive-tbw", rating)  # nanTB stopped the estimate's rendering with a traceback
    assert result.returncode == 2 and "a drive rating must be" in result.stderr and rating in result.stderr, \
        result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("kind", ["missing_model", "unknown_architecture", "missing_ds_config", "bad_machine",
                                  "missing_machine", "zero_stage_2", "bad_profile", "budget_over_the_machine",
                                  "nvme_path_with_a_machine_file", "nested_block"])
def test_bad_inputs_are_named(tmp_path, kind):
    model, machine, ds_config = "llama-7b", MACHINE, DS_CONFIG
    if kind == "missing_model":
        model, expected = str(tmp_path / "nope.json"), f"model config {tmp_path}/nope.json does not exist"
    elif kind == "unknown_architecture":
        model = str(tmp_path / "mamba.json")
        (tmp_path / "mamba.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 768}))
        expected = f"{model}: model_type 'mamba' is not one the estimate knows (key \"model_type\""
    elif kind == "missing_ds_config":
        ds_config, expected = str(tmp_path / "ds.json"), f"DeepSpeed config {tmp_path}/ds.json does not exist"
    elif kind == "bad_machine":
        data = json.load(open(MACHINE))
        del data["nvme_read_bytes_per_s_per_drive"]
        machine = str(tmp_path / "box.json")
        (tmp_path / "box.json").write_text(json.dumps(data))
        expected = f"machine file {machine}: missing key(s) 'nvme_read_bytes_per_s_per_drive'"
    elif kind == "missing_machine":
        machine, expected = str(tmp_path / "box.json"), f"machine file {tmp_path}/box.json does not exist"
    elif kind == "bad_profile":
        (tmp_path / "profile.json").write_text(json.dumps({"version": 1}))
        result = estimate("--profile", str(tmp_path / "profile.json"))
        assert result.returncode == 2 and f"profile {tmp_path}/profile.json cannot be read: profile format version 1" \
            in result.stderr, result.stderr
        return
    elif kind == "nvme_path_with_a_machine_file":  # nothing is measured: the folder was ignored, silently
        result = estimate("--nvme-path", str(tmp_path / "nvme"))
        assert result.returncode == 2 and "--nvme-path names the folder `--machine this` measures" in result.stderr, \
            result.stderr
        return
    elif kind == "nested_block":  # the run stops on it (DeepSpeed's own model, tencache's check): it was priced
        data = json.load(open(DS_CONFIG))
        data["zero_optimization"]["tencache"] = {}
        ds_config = str(tmp_path / "ds.json")
        (tmp_path / "ds.json").write_text(json.dumps(data))
        expected = 'zero_optimization.tencache: the "tencache" block belongs at the top level'
    elif kind == "budget_over_the_machine":  # the run refuses it at initialize: the estimate said "fits: yes"
        data = json.load(open(DS_CONFIG))
        data["tencache"] = {"host_cache_bytes": "2TiB"}  # the machine file's host has 256 GiB
        ds_config = str(tmp_path / "ds.json")
        (tmp_path / "ds.json").write_text(json.dumps(data))
        # ... than the described machine's memory, not "this machine's": the estimate may run on a laptop
        expected = "tencache.host_cache_bytes = 2199023255552 (2.00 TiB) is more than the physical memory of the " \
                   "described machine "
    else:
        data = json.load(open(DS_CONFIG))
        data["zero_optimization"]["stage"] = 2
        ds_config = str(tmp_path / "ds.json")
        (tmp_path / "ds.json").write_text(json.dumps(data))
        expected = "zero_optimization.stage must be 3"
    result = estimate(model=model, machine=machine, ds_config=ds_config)
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.slow
def test_machine_this_measures_and_cites_each_figure(tmp_path):
    """Scenario: calibrate this machine on a temporary folder and save the machine file."""
    # Step 1: estimate gpt2-tiny on this machine, measured now (in fp32: the beyond-RAM config's precision).
    saved = tmp_path / "this.json"
    # (fp32: bf16 matmuls run ~24x slower on this AVX2 machine, and the compute probe would wait them out)
    # (aio.intra_op_parallelism 3: each store keeps 3 requests in flight, and so does the drive probe)
    data = json.load(open(os.path.join(REPO_ROOT, "configs", "stock-nvme-beyond-ram.json")))
    data["aio"]["intra_op_parallelism"] = 3
    config = tmp_path / "ds.json"
    config.write_text(json.dumps(data))
    # (the drive's trials shortened, drive_rate.QUICK_ENV: its rate is not what this test checks)
    result = run_cli("estimate", "--model", "gpt2-tiny", "--ds-config", str(config), "--machine", "this", "--seq", "64",
                     "--nvme-path", str(tmp_path / "nvme"), "--save-machine", str(saved), "--json", timeout=600,
                     env_extra={drive_rate.QUICK_ENV: "1"})
    assert result.returncode == 0, result.stderr
    # the minutes of measuring are said on stderr as they pass (stdout stays the JSON report)
    assert "measuring this machine" in result.stderr and "measured the drive (" in result.stderr and \
        "measured the layers beside the drive (" in result.stderr, result.stderr
    # Step 2: the saved file loads as a machine file and says where each measured figure came from.
    machine = json.loads(saved.read_text())
    for figure in ("accelerator_flops_per_s", "nvme_read_bytes_per_s_per_drive", "cpu_adam_elements_per_s",
                   "host_copy_bytes_per_s", "host_fresh_write_bytes_per_s"):
        assert machine[figure] > 0 and "measured" in machine["sources"][figure]
    assert "tencache DirectFileIO" in machine["sources"]["nvme_read_bytes_per_s_per_drive"]
    assert ", 3 in flight" in machine["sources"]["nvme_read_bytes_per_s_per_drive"]
    assert f"shortened by {drive_rate.QUICK_ENV}" in machine["sources"]["nvme_read_bytes_per_s_per_drive"]
    # the drive at 4 MiB and large requests too, relative to the rates at 64 MiB (the large size: 512 MiB, cut so
    # that the 3 requests in flight take at most 1 GiB)
    sizes = [size for size, _read, _write in machine["nvme_request_factors"]]
    assert sizes == [4 << 20, 64 << 20, (1 << 30) // 3] and machine["nvme_request_factors"][1][1:] == [1.0, 1.0]
    assert all(read > 0 and write > 0 for _size, read, write in machine["nvme_request_factors"])
    assert "measured" in machine["sources"]["nvme_request_factors"]
    import torch
    if torch.cuda.is_available():  # the CPU accelerator's own probes are left out where CUDA sees a GPU
        assert not machine.get("accelerator_is_host") and machine["accelerator_memory_bytes"] > 0
        for figure in ("zero3_module_call_s", "allgather_bytes_per_s", "reduce_scatter_bytes_per_s", "io_contention"):
            assert machine["sources"][figure].startswith("not measured: ")
    else:
        assert machine["zero3_module_call_s"] >= 0 and "ZeRO-3 engine" in machine["sources"]["zero3_module_call_s"]
        # the layers beside the drive, the engine's 3 requests in flight as a store keeps them
        assert machine["io_contention"] >= 0 and "3 in flight" in machine["sources"]["io_contention"]
        assert "1 round (" in machine["sources"]["io_contention"] and drive_rate.QUICK_ENV in machine["sources"][
            "io_contention"]  # (shortened by the drive's test hook: one round)
        # stage 3's collectives between 2 processes of this machine (gloo), the bytes a rank receives per second
        for figure in ("allgather_bytes_per_s", "reduce_scatter_bytes_per_s"):
            assert machine[figure] > 0 and "measured" in machine["sources"][figure]
        assert "2 processes, gloo" in machine["sources"]["allgather_bytes_per_s"]
    assert json.loads(result.stdout)["step_time_s"]["stock"] > 0
    assert machine["measured_for"]["model"] == "gpt2-tiny.json" and machine["measured_for"]["seq"] == "64"
    # Step 3: the probe's files are gone.
    assert os.listdir(tmp_path / "nvme") == []
    shutil.rmtree(tmp_path / "nvme", ignore_errors=True)


def test_a_machine_measured_for_another_model_or_host_is_said_so(tmp_path):
    """Regression test (helper-212): a machine `--machine this --save-machine` measured holds that model's and
    host's compute figures; reused with another model (or on another host) it priced the run silently."""
    import socket
    with open(os.path.join(REPO_ROOT, "configs", "machines", "this-2core-vm.json")) as handle:
        machine = json.load(handle)
    machine["measured_for"] = {"host": socket.gethostname(), "model": "gpt2-tiny.json", "micro_batch": "2",
                               "seq": "64", "dtype": "bf16"}
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(machine))
    same = estimate("--seq", "64", model="gpt2-tiny", machine=str(path), ds_config=os.path.join(
        REPO_ROOT, "configs", "stock-nvme.json"))
    assert same.returncode == 0 and "was measured for another run" not in same.stderr, same.stderr
    other = estimate("--seq", "64", model="gpt2-small", machine=str(path), ds_config=os.path.join(
        REPO_ROOT, "configs", "stock-nvme.json"))
    assert other.returncode == 0, other.stderr
    assert "was measured for another run (model gpt2-tiny.json there, gpt2-small.json here)" in other.stderr


def test_a_profile_of_another_model_is_refused_before_this_machine_is_measured(tmp_path):
    """Regression test (helper-194): with ``--machine this``, a profile recorded for another model was refused only
    after the calibration (minutes), and ``--save-machine`` never written: it is checked first now."""
    profile = os.path.join(REPO_ROOT, "docs", "validate", "fp32-2026-11-30-run11", "gpt2-tiny-auto",
                           "tencache-1.profile.json")
    result = estimate("--profile", profile, "--nvme-path", str(tmp_path), "--save-machine", str(tmp_path / "m.json"),
                      model="gpt2-small", machine="this", ds_config=os.path.join(REPO_ROOT, "configs",
                                                                                  "stock-nvme.json"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "recorded for another model or config" in result.stderr, result.stderr
    assert "measuring this machine" not in result.stderr, result.stderr


@pytest.mark.parametrize("change, stock_fits, reason", [
    ({"aio": {"use_gds": True}}, True, "aio.use_gds"),
    ({"aio": {"intra_op_parallelism": 128}}, True, "aio.intra_op_parallelism"),  # tencache's limit, not stock's
    ({"zero_optimization": {"zero_hpz_partition_size": 2}}, False, "zero_optimization.zero_hpz_partition_size"),
    # an enabled block with nothing on NVMe (helper-206: "fits: yes", "the run is stock DeepSpeed's")
    ({"zero_optimization": {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
      "tencache": {}}, True, "zero_optimization.offload_param.device"),
])
def test_a_config_the_run_refuses_at_start_up_does_not_fit(tmp_path, change, stock_fits, reason):
    """Regression test (helper-194): a config tencache refuses at deepspeed.initialize (GPUDirect Storage's buffers,
    hpZ copies on NVMe, which stop stock's zero.Init too) was answered "fits: yes"."""
    with open(DS_CONFIG) as handle:
        config = json.load(handle)
    for section, keys in change.items():
        config[section] = dict(config.get(section) or {}, **keys)
    path = tmp_path / "refused.json"
    path.write_text(json.dumps(config))
    result = estimate("--json", ds_config=str(path))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert not report["fits"] and report["fits_stock"] is stock_fits, report["why_not"]
    assert any(why.startswith("tencache refuses it at deepspeed.initialize: " + reason)
               for why in report["why_not"]["tencache"]), report["why_not"]
    assert stock_fits or any(reason in why for why in report["why_not"]["stock"]), report["why_not"]


def test_bf16_masters_and_state_are_read_from_the_config_and_stop_stock(tmp_path):
    """bf16 masters and optimizer state: half the optimizer's bytes on NVMe, and stock NVMe stops at its first
    update (measured here; tests/plan/test_step_model.py has the numbers)."""
    with open(DS_CONFIG) as handle:
        config = json.load(handle)
    fp32 = json.loads(estimate("--json", "--seq", "2048").stdout)
    config["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    path = tmp_path / "bf16-masters.json"
    path.write_text(json.dumps(config))
    result = estimate("--json", "--seq", "2048", ds_config=str(path))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["master_element_bytes"], report["optimizer_state_element_bytes"]) == (2, 2)
    assert report["fits"] and not report["fits_stock"]
    assert any("first optimizer step" in reason for reason in report["why_not"]["stock"])
    assert report["needs"]["nvme"] < fp32["needs"]["nvme"] * 0.6
    text = estimate("--seq", "2048", ds_config=str(path)).stdout
    assert "masters 2 B, optimizer state 2 B an element" in text and "fits (stock): NO: stock stops" in text


def test_an_optimizer_with_one_state_tensor_is_priced_and_said_so(tmp_path):
    """DeepSpeed's CPU Adagrad keeps one state tensor per element where Adam keeps two: less on NVMe, and the report
    says which state it priced, and that its CPU step is priced at CPU Adam's rate."""
    with open(DS_CONFIG) as handle:
        config = json.load(handle)
    adam = json.loads(estimate("--json", "--seq", "2048", ds_config=DS_CONFIG).stdout)
    config["optimizer"] = {"type": "Adagrad", "params": {"lr": 1e-2}}
    path = tmp_path / "adagrad.json"
    path.write_text(json.dumps(config))
    adagrad = json.loads(estimate("--json", "--seq", "2048", ds_config=str(path)).stdout)
    assert adam["optimizer_state_tensors"] == ["exp_avg", "exp_avg_sq"]
    assert adagrad["optimizer_state_tensors"] == ["exp_avg_sq"]
    assert adagrad["needs_stock"]["nvme"] < adam["needs_stock"]["nvme"]
    text = estimate("--seq", "2048", ds_config=str(path)).stdout
    assert "optimizer state exp_avg_sq (its CPU step priced at CPU Adam's rate)" in text, text
    assert "optimizer state" not in estimate("--seq", "2048", ds_config=DS_CONFIG).stdout.splitlines()[0]
    # a type whose state the model does not know is priced as Adam, and the report says it assumed that
    config["optimizer"] = {"type": "Lamb", "params": {"lr": 1e-3}}
    path.write_text(json.dumps(config))
    lamb = json.loads(estimate("--json", "--seq", "2048", ds_config=str(path)).stdout)
    assert not lamb["optimizer_state_known"] and lamb["optimizer_state_tensors"] == adam["optimizer_state_tensors"]
    assert adam["optimizer_state_known"] and adagrad["optimizer_state_known"]
    first_line = estimate("--seq", "2048", ds_config=str(path)).stdout.splitlines()[0]
    assert "optimizer state assumed to be Adam's" in first_line, first_line


def test_the_retrospective_check_predicts_a_bench_at_its_ranks_and_gradient_accumulation(tmp_path):
    """scripts/validate_estimate.py --from-bench: a 2-rank bench at GAS 4 (docs/bench/gpt2-small-2ranks-gas4) is
    predicted per rank, as it ran: stock NVMe's rank 0 read 3086.6 MiB and wrote 1186.3 MiB a step. (It was predicted
    at one rank and the config's GAS 1: 2x the bytes written, a quarter of the reads' micro-batches.)"""
    result = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "scripts", "validate_estimate.py"), "--from-bench",
                             os.path.join(REPO_ROOT, "docs", "bench", "gpt2-small-2ranks-gas4"), "--machine",
                             os.path.join(REPO_ROOT, "configs", "machines", "this-2core-vm.json"), "--out",
                             str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "rows.json") as handle:
        stock = next(row for row in json.load(handle) if row["arm"] == "stock")
    assert stock["predicted"]["nvme_read_bytes"] == pytest.approx(3086.6 * (1 << 20), rel=0.01)
    assert stock["predicted"]["nvme_write_bytes"] == pytest.approx(1186.3 * (1 << 20), rel=0.01)


def test_a_recheck_reprices_with_the_model_probes_figures_only_and_tables_both_errors():
    """scripts/validate_estimate.py --recheck: the figures MODEL_PROBES measure replace the calibration's (the rest of
    the machine stays), and the table keeps the saved predictions' errors and adds the re-priced ones."""
    validate = load_validate_script()
    machine = validate.load_machine(os.path.join(REPO_ROOT, "configs", "machines", "this-2core-vm.json"))
    again = validate.with_model_probes(machine, {"compute": {"flops_per_s": 1e11}, "zero3_calls": {"call_s": 2e-3},
                                                 "io_contention": {"io_contention": 0.5}})
    assert (again.accelerator_flops_per_s, again.zero3_module_call_s, again.io_contention) == (1e11, 2e-3, 0.5)
    assert again.nvme_read_bytes_per_s_per_drive == machine.nvme_read_bytes_per_s_per_drive
    figures = {"nvme_read_bytes": 0, "nvme_write_bytes": 0, "host_bytes": 1 << 30}
    rows = [{"name": "gpt2-tiny-auto", "arm": "stock", "predicted": dict(figures, step_time_s=1.3),
             "measured": dict(figures, step_time_s=1.0), "repriced": dict(figures, step_time_s=1.1)}]
    text = validate.table(rows)
    assert "| gpt2-tiny-auto | stock | 1.300 / 1.000 | +30% |" in text and "within 15%: 0 of 1" in text
    assert "| gpt2-tiny-auto | stock | 1.100 / 1.000 | +10% |" in text and "Re-priced, within 15%: 1 of 1." in text


def test_a_reprice_prices_a_saved_run_again_from_its_own_machine_files_and_profiles(tmp_path, capsys):
    """scripts/validate_estimate.py --reprice: each saved configuration of a prospective folder (run 21's) priced again
    beside its saved prediction and its bench; "profiled" puts the model's profile on its calibration as the run did
    (the run's profiled machine files have the FLOP rate this gives), "calibration" takes the calibration alone."""
    validate = load_validate_script()
    folder = os.path.join(REPO_ROOT, "docs", "validate", "fp32-2026-12-01-run21-profiled")
    (profiled, used), (calibrated, _) = validate.reprice(folder, "profiled"), validate.reprice(folder, "calibration")
    assert len(profiled) == len(calibrated) == 18
    assert used["gpt2-small"].endswith("machine-gpt2-small.json with docs/validate/fp32-2026-12-01-run21-profiled/"
                                       "profile-gpt2-small.json")
    saved = validate.read_json(os.path.join(folder, "predictions.json"))["predictions"]
    for row in profiled:
        assert row["predicted"] == saved[row["name"]]["predicted"][row["arm"]]
        assert row["measured"] == validate.measured_from_bench(os.path.join(folder, row["name"]))["arms"][row["arm"]]
    for model in ("gpt2-tiny", "gpt2-small", "gpt2-medium"):  # the machine the run priced with, rebuilt
        calibration = validate.load_machine(validate.calibration_path(folder, model, first=model == "gpt2-tiny"))
        again, _ = validate.machine_from_saved_profile(calibration, model, validate.CONFIG_FOR.get(
            model, validate.DEFAULT_CONFIG), "fp32", 2, 64, validate.profile_path(folder, model))
        run = validate.load_machine(os.path.join(folder, f"machine-{model}-profiled.json"))
        # within 5%, not exactly: the profile's compute is taken net of the host memory work the model prices, and
        # since 2026-12-05 that leaves out the one-rank reduce's copy into stage 3's bucket, which the run's code made
        # (one_rank_reduce.py): the three models' rates rebuilt 3.1-3.9% below the run's
        assert again.accelerator_flops_per_s == pytest.approx(run.accelerator_flops_per_s, rel=0.05)
        assert calibration.accelerator_flops_per_s != pytest.approx(run.accelerator_flops_per_s, rel=0.05)
    assert validate.main(["--reprice", folder, "--out", str(tmp_path)]) == 0
    text = (tmp_path / "table.md").read_text()
    assert "not prospective" in text and "step time re-priced (profiled) / measured (s)" in text
    with pytest.raises(SystemExit):  # the run's own table is not overwritten
        validate.main(["--reprice", folder, "--out", folder])
    with pytest.raises(SystemExit):  # a folder that is not a prospective run's: refused before anything is written
        validate.main(["--reprice", str(tmp_path / "elsewhere"), "--out", str(tmp_path / "out")])
    # what the folder records is refused, not ignored: a list, a number, a switch, a flag whose default is None
    for flags in (["--models", "gpt2-small"], ["--seq-len", "128"], ["--compare-cpu"], ["--dtype", "fp32"]):
        with pytest.raises(SystemExit):
            validate.main(["--reprice", folder, "--out", str(tmp_path / "out")] + flags)
        assert f"{flags[0]} describes runs to make" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --reprice-from without --reprice: refused, not ignored
        validate.main(["--reprice-from", "calibration", "--machine", "none.json", "--out", str(tmp_path / "out")])
    assert "--reprice-from says how --reprice prices" in capsys.readouterr().err
    copy = tmp_path / "run-without-a-profile"  # a profile the run priced with, deleted since: named, not a traceback
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("profile-gpt2-small.json"))
    with pytest.raises(SystemExit):
        validate.main(["--reprice", str(copy), "--out", str(tmp_path / "out")])
    assert "profile-gpt2-small.json, which is missing" in capsys.readouterr().err
    assert validate.main(["--reprice", str(copy), "--reprice-from", "calibration", "--out", str(tmp_path / "cal")]) == 0
    assert not (tmp_path / "out").exists()


def test_a_gpu_profile_run_keeps_the_device_tier_and_a_reprice_fits_the_block_its_profile_ran_with(tmp_path):
    """scripts/validate_estimate.py --profile-runs: on a host accelerator the profile run turns the device tier off,
    on a GPU it keeps it as the benches run it. The first GPU run (docs/validate/bf16-2026-12-04-gpu1-h200) profiled
    with it off, and that profile's step (0.288 s, a gather for each use of a partition) priced tencache's "auto"
    step, tier on, 16% over (0.283 s against 0.243). A reprice fits the compute to the block the profile run
    recorded: the folder's own reproduces its predictions; a tier-on profile of the same shape (the "auto" bench's
    own, so not a prediction) prices that step within 2%: the profile's step is what moved it, the block fitted to
    it changes the price by 2.4%."""
    validate = load_validate_script()
    folder = os.path.join(REPO_ROOT, "docs", "validate", "bf16-2026-12-04-gpu1-h200")
    cpu = validate.load_machine(os.path.join(REPO_ROOT, "configs", "machines", "this-2core-vm.json"))
    gpu = validate.load_machine(os.path.join(folder, "machine.json"))
    assert cpu.accelerator_is_host and not gpu.accelerator_is_host
    assert validate.profile_run_block(cpu)["device_cache_bytes"] == 0
    assert "device_cache_bytes" not in validate.profile_run_block(gpu)

    def auto_step(where):
        rows, _ = validate.reprice(where, "profiled")
        row = next(row for row in rows if row["name"] == "gpt2-small-auto" and row["arm"] == "tencache")
        return row["repriced"]["step_time_s"], row["measured"]["step_time_s"]

    rows, _ = validate.reprice(folder, "profiled")
    assert len(rows) == 4 and all(_same_prices(row["repriced"], row["predicted"]) for row in rows)
    tier_on = tmp_path / "tier-on"
    shutil.copytree(folder, tier_on)
    shutil.copy(tier_on / "gpt2-small-auto" / "tencache-1.profile.json", tier_on / "profile-gpt2-small.json")
    result = validate.read_json(str(tier_on / "profile-gpt2-small.result.json"))
    del result["ds_config"]["tencache"]["device_cache_bytes"]  # as the profile run on a GPU now runs
    (tier_on / "profile-gpt2-small.result.json").write_text(json.dumps(result))
    priced, measured = auto_step(str(tier_on))
    assert priced == pytest.approx(measured, rel=0.02)
    result["ds_config"]["tencache"]["device_cache_bytes"] = 0  # the same profile fitted as a tier-off run's
    (tier_on / "profile-gpt2-small.result.json").write_text(json.dumps(result))
    with pytest.raises(SystemExit):  # a GPU's machine file with a profile run on this machine: refused, nothing run
        validate.main(["--profile-runs", "--machine", os.path.join(folder, "machine.json"), "--out",
                       str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()
    as_off = auto_step(str(tier_on))[0]  # the fit's other prices beside the FLOPs: 6 ms here, the profile's step
    assert as_off != pytest.approx(priced, rel=1e-3) and as_off == pytest.approx(priced, rel=0.05)  # the rest


def test_short_steps_are_measured_for_at_least_the_time_asked_by_the_fastest_predicted_arm(tmp_path, capsys):
    """scripts/validate_estimate.py --min-measured-s: a configuration whose fastest arm is predicted at 0.25 s a step
    runs 3 + 40 steps for 10 s of measured steps; a slow one keeps --steps; 0 (the default) changes nothing; a
    negative one is refused before anything is written."""
    validate = load_validate_script()
    tiny = {"stock": {"step_time_s": 0.8}, "tencache": {"step_time_s": 0.25}}
    medium = {"stock": {"step_time_s": 18.0}, "tencache": {"step_time_s": 6.0}}
    assert validate.steps_to_run(8, 3, 10.0, tiny) == 43
    assert validate.steps_to_run(8, 3, 10.0, medium) == 8
    assert validate.steps_to_run(8, 3, 0.0, tiny) == 8
    with pytest.raises(SystemExit):
        validate.main(["--min-measured-s", "-1", "--out", str(tmp_path / "out")])
    assert "--min-measured-s -1.0: seconds of measured steps, at least 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def load_validate_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("validate_estimate",
                                                  os.path.join(REPO_ROOT, "scripts", "validate_estimate.py"))
    validate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(validate)
    return validate


@pytest.mark.deepspeed
def test_a_profile_run_prices_the_model_with_the_steps_after_its_first(tmp_path):
    """scripts/validate_estimate.py --profile-runs: a short tencache run of the bench's shape (the real engine,
    real files), whose params profile has steady timings (the device tier off: on this host accelerator it would
    serve every access after the first step) and sets the compute figure the predictions use."""
    validate = load_validate_script()
    args = validate.argparse.Namespace(config=None, out=str(tmp_path), micro_batch=2, seq_len=64,
                                       nvme_path=str(tmp_path / "nvme"), dtype="fp32")
    machine = validate.load_machine(os.path.join(REPO_ROOT, "configs", "machines", "this-2core-vm.json"))
    try:
        profiled, notes = validate.profiled_machine(args, "gpt2-tiny", machine)
    finally:  # the run's swap files: nothing reads them after it
        shutil.rmtree(args.nvme_path, ignore_errors=True)
    sections = validate.read_sections(str(tmp_path / "profile-gpt2-tiny.json"))
    assert sections["params"].steady is not None and sections["params"].steady.steps == validate.STEADY_STEPS
    assert sections["params"].steady.reads == 0  # "auto" holds gpt2-tiny: nothing read after the first fill
    assert profiled.accelerator_flops_per_s != machine.accelerator_flops_per_s
    assert profiled.nvme_read_bytes_per_s_per_drive == machine.nvme_read_bytes_per_s_per_drive
    assert len(notes) == 1 and f"the median of {validate.STEADY_STEPS} steps after the recorded one" in notes[0]


def test_the_budgets_line_gives_the_start_up_split_and_what_the_governor_keeps(tmp_path):
    """gpt2-1.3b fp32 beyond RAM with 19 GiB available: "auto" starts at a quarter of it and gives back at the
    governor's first reading, a step's 4 GiB rise assumed (plan/step_model/tencache.py ``_governed_tier``); the
    line says both."""
    with open(os.path.join(REPO_ROOT, "configs", "machines", "this-2core-vm.json")) as handle:
        figures = json.load(handle)
    figures["host_available_bytes"] = 19 * 1024 ** 3
    machine = tmp_path / "machine.json"
    machine.write_text(json.dumps(figures))
    config = os.path.join(REPO_ROOT, "configs", "stock-nvme-beyond-ram.json")
    args = ("--micro-batch", "1", "--seq", "32")
    result = estimate(*args, model="gpt2-1.3b", machine=str(machine), ds_config=config)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("budgets (tencache)"))
    assert " at start-up; the governor keeps " in line and "from its first reading, before any step" in line, line
    budgets = json.loads(estimate("--json", *args, model="gpt2-1.3b", machine=str(machine), ds_config=config).stdout)[
        "budgets"]
    assert budgets["param_cache_bytes"] < budgets["param_cache_start_bytes"]
    assert budgets["optimizer_share_bytes"] < budgets["optimizer_start_share_bytes"]


def _same_prices(repriced: dict, predicted: dict) -> bool:
    """The same prediction to the rounding of its sums: the model's later changes may reorder them (the streaming
    row's first reads started during the update moved its critical path's NVMe read by 2e-15 s)."""
    return repriced.keys() == predicted.keys() and all(
        _same_prices(value, predicted[key]) if isinstance(value, dict) else
        value == pytest.approx(predicted[key], rel=1e-12) if isinstance(value, float) else value == predicted[key]
        for key, value in repriced.items())


@pytest.mark.parametrize("config, ranks, expected", [
    ({"train_batch_size": 64}, 1, (64, 1)),                                        # DeepSpeed: micro 64, GAS 1
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2}, 1, (2, 8)),   # GAS derived
    ({"train_batch_size": 16, "gradient_accumulation_steps": 2}, 4, (2, 2)),      # micro derived at 4 ranks
    ({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5}, 8, (3, 5)),
    ({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto"}, 1, (1, 1)),  # a Trainer fills them
    ({}, 1, (1, 1)),
])
def test_the_batch_shape_is_derived_as_deepspeed_derives_it(config, ranks, expected):
    """Until 2026-12-07 a missing micro-batch or GAS was taken for 1: a config with train_batch_size 64 alone was
    priced at a micro-batch of 1 (helper-176)."""
    from tencache_ds.cli.estimate import batch_shape
    assert batch_shape(config, "ds.json", ranks) == expected
    assert batch_shape(config, "ds.json", ranks, micro_batch=7, gas=2) == (7, 2)  # --micro-batch and --gas rule


def test_a_train_batch_too_small_for_the_ranks_and_a_sequence_beyond_the_position_table_are_refused(tmp_path):
    from tencache_ds.cli.estimate import batch_shape, sequence_length
    from tencache_ds.errors import TencacheConfigError
    with pytest.raises(TencacheConfigError, match="train_batch_size 4 / 8 rank"):
        batch_shape({"train_batch_size": 4}, "ds.json", 8)
    # derived with a remainder: 10 / 4 per micro-batch is 2 steps of accumulation and 2 samples left over, which
    # DeepSpeed's _batch_assertion refuses (helper-212: priced as fitting)
    with pytest.raises(TencacheConfigError, match="train_batch_size 10 is no whole multiple"):
        batch_shape({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, "ds.json", 1)
    with pytest.raises(TencacheConfigError, match="train_batch_size 10 is no whole multiple"):
        batch_shape({"train_batch_size": 10, "gradient_accumulation_steps": 3}, "ds.json", 1)
    assert batch_shape({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 3}, "ds.json", 2) == (3, 2)
    gpt2 = {"model_type": "gpt2", "n_positions": 256}
    assert sequence_length(gpt2, None, "m.json") == 256 and sequence_length(gpt2, 128, "m.json") == 128
    with pytest.raises(TencacheConfigError, match="n_positions 256"):
        sequence_length(gpt2, 2048, "m.json")
    assert sequence_length({"model_type": "llama", "max_position_embeddings": 256}, 4096, "m.json") == 4096  # RoPE
    ds_config = tmp_path / "ds.json"
    ds_config.write_text(json.dumps({"train_batch_size": 64, "zero_optimization": {"stage": 3}}))
    result = estimate("--json", ds_config=str(ds_config), model="gpt2-tiny")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["micro_batch"], report["gas"], report["seq"]) == (64, 1, 256)
    refused = estimate("--seq", "512", ds_config=str(ds_config), model="gpt2-tiny")
    assert refused.returncode == 2 and "--seq 512 is longer than its position table" in refused.stderr


def test_swap_files_larger_than_the_free_space_do_not_fit(tmp_path):
    """A machine that says how much is free where the swap files go (`--machine this` reads it in the folder it
    measures): the node's swap files must fit there. Until 2026-12-07 nothing compared them (helper-176): llama-70b's
    899 GiB "fit" a 500 GB drive."""
    with open(MACHINE) as handle:
        machine = json.load(handle)
    machine["nvme_free_bytes"] = 10 * 2**30
    small = tmp_path / "small-drive.json"
    small.write_text(json.dumps(machine))
    report = json.loads(estimate("--json", machine=str(small)).stdout)  # llama-7b on NVMe: ~110 GiB of files
    assert not report["fits"] and any("NVMe space" in reason for reason in report["why_not"]["tencache"])
    assert any("NVMe space" in reason for reason in report["why_not"]["stock"])
    machine["nvme_free_bytes"] = 10 * 2**40
    small.write_text(json.dumps(machine))
    report = json.loads(estimate("--json", machine=str(small)).stdout)
    assert not any("NVMe space" in reason for reasons in report["why_not"].values() for reason in reasons)


def test_the_swap_files_room_is_read_only_where_they_all_go_to_the_folder_measured(tmp_path):
    """The parameters' and the optimizer's nvme_paths on two file systems: their bytes were all charged to the
    measured folder's (helper-179); not known then. Same file system: its free bytes."""
    from tencache_ds.cli.estimate import _swap_files_room
    one = {"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": str(tmp_path / "p")},
                                 "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "o")}}}
    free, source = _swap_files_room(one, str(tmp_path / "o"))
    assert free is not None and free > 0 and source.startswith("free space in")
    two = {"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": "/dev/shm/p"},
                                 "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "o")}}}
    if os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev:
        assert _swap_files_room(two, str(tmp_path / "o"))[0] is None


@pytest.mark.parametrize("config, message", [
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}, "is not"),
])
def test_a_batch_shape_deepspeed_refuses_is_refused(config, message):
    """All three given and inconsistent: DeepSpeed's _batch_assertion stops the run; it was priced (helper-179).
    A whole float is DeepSpeed's arithmetic's; sequence parallelism divides the data ranks."""
    from tencache_ds.cli.estimate import batch_shape, sequence_length
    from tencache_ds.errors import TencacheConfigError
    with pytest.raises(TencacheConfigError, match=message):
        batch_shape(config, "ds.json", 8)
    assert batch_shape({"train_batch_size": 64.0}, "ds.json", 1) == (64, 1)
    assert batch_shape({"train_batch_size": 64, "sequence_parallel_size": 4}, "ds.json", 8) == (32, 1)
    assert sequence_length({"model_type": "gpt2"}, None, "m.json") == 1024  # Hugging Face's default n_positions
