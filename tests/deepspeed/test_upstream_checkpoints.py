"""Some of DeepSpeed's own checkpoint tests (our versions: upstream_checkpoints.py), 2 ranks, with the optimizer on
NVMe under tencache: each passes with the results of stock CPU offload, bit for bit (stock NVMe stops in each with
"consumed N numels out of 0": its ZeRO file has no fp32 masters, integrations/deepspeed/checkpoint_save.py).

- zero_to_fp32 (both variants of test_1_param_group: all parameters trained, first layer frozen): train, save, then
  ``load_state_dict_from_zero_checkpoint`` gives the trained fp32 weights, and ``zero_to_fp32`` consolidates them;
  and (not upstream) with the parameters offloaded too, built under zero.Init, the frozen layer's partitions on NVMe
  (saved as their swapped-out placeholder, zero_to_fp32 stopped: helper-182);
- immediate_save_load: save right after ``initialize``, load it (``load_optimizer_states=False``), train on;
- load_immediate_save: train, save, a new engine loads it and saves again into the same tag at once;
- load_into_new_engine: train with a warm-up lr scheduler and biases kept whole on every rank (DeepSpeed's default
  persistence threshold), save; a new engine in the same process loads the optimizer's state, or not, or the module
  only, and trains on (the loaded files take the new engine's sub-group ids);
- loss_scale_restored (not upstream): a load of the optimizer's state restores the loss scaler's (its scale set to
  4 before the save; stock's NVMe load skipped it, restarting an fp16 run's dynamic scale);
- load_saved_before_any_step (not upstream): a checkpoint saved right after ``initialize``, loaded with its
  optimizer's state by the same engine 2 steps later: Adam starts over (tencache kept the live state until
  2026-12-06: other losses);
- load_into_trained_engine (not upstream): an engine that has trained loads a checkpoint without its optimizer's
  state, or the module only, and trains on: the weights are the checkpoint's, Adam's moments stay live (the
  engine's NVMe branch copied the checkpoint's moment files over the live ones; tencache copies none of them);
- load_after_a_backward_without_its_step (not upstream): a backward whose step never comes, then a load of a
  checkpoint with its optimizer's state, then training on: the reads that backward started ahead (tencache, the state
  streaming) are not served to the load;
- save_before_accumulation_is_done (TestZeROSaveLoadEdgeCase::test_save_before_accum_grad_is_done, carried on): with
  GAS 2, the 16-bit model and a checkpoint saved after one micro-batch, then the window finished and training on, and
  a fresh engine resumed from that checkpoint (tencache with the state streaming: the backward has read ahead when
  the saves come; stock NVMe's trained weights differ there, its 2-rank drift);
- latest_checkpoint (TestLatestCheckpoint): a load from a folder with no ``latest`` file returns no path and the
  engine trains on; a save and a load with no tag go through ``latest``, and the resumed weights are those of the
  run that never stopped (stock CPU offload's own resume differs from it in the last bits);
- nvme_checkpointing (TestNVMeCheckpointing): for each placement of the parameters and the optimizer on NVMe, cpu or
  neither, with a sub-group per parameter: train, save, train on; a fresh engine loads and trains the same steps;
  the last loss of both is the same;
- tag_validation (TestCheckpointValidationTag): each rank saves under a tag of its own; ``"FAIL"`` stops the save
  on every rank before any file is written (into tags every rank saved whole before, which then load: until
  2026-12-08 the refused save had removed each rank's swap files of its tag first), ``"WARN"`` saves each rank's
  files into its own tag, and training goes on after both; an unknown mode stops ``deepspeed.initialize``;
- integer_tag (not upstream): a save and a load by an integer tag (the load stopped part way on a TypeError with
  the optimizer on NVMe, stock NVMe's too);
- load_at_other_world_size (DeepSpeed's stage 3 has no elastic checkpoint; in bf16, so that a load that set the fp32
  masters from the bf16 weights shows): a checkpoint saved by 2 ranks (save_for_other_world_size) loaded by 1, with the
  optimizer's state (stock CPU offload's error) and without it (the weights repartitioned, training on); and its
  universal version (``ds_to_universal``, after `tencache-ds checkpoint-for-cpu` for tencache's), with and without the
  optimizer's state (stock NVMe: FileNotFoundError); the same loads by 2 ranks (the universal version:
  TestZeROUniversalCheckpointDP's 2 to 2); and (in save_for_other_world_size) loaded by an engine with another
  ``sub_group_size``: the same two loads;
- load_saved_on_cpu (not upstream): a checkpoint saved with the optimizer on cpu loaded with it on NVMe, with its
  optimizer's state (from the ZeRO file into the swap files: the losses and weights of the uninterrupted run) and
  without it (the weights as stock CPU offload loads them);
- saved_on_nvme (not upstream): tencache's checkpoint loaded by stock CPU offload (a process that never imported
  tencache_ds): the weights load and train on, the optimizer's state stops the load with an error (the moments are in
  the checkpoint's swap files only), and loads once `tencache-ds checkpoint-for-cpu` has written them into the ZeRO
  files: the run goes on as stock CPU offload goes on from its own checkpoint of the same run;
- load_into_reordered_model (not upstream): a weights-only load by a model whose parameters are registered in
  another order, with the same names and shapes: the weights are the saved ones, by name;
- loads_params_beyond_max_in_cpu (not upstream): loads without the optimizer's state and of the module only with
  the parameters on NVMe beyond ``max_in_cpu`` (which stage 3 cannot finish: by its code, it reads ``.data`` of a
  missing flat partition, mid-load), the optimizer on NVMe and on cpu: stock CPU offload's bits.
Real engine, real files."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, launch_ranks

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]  # about 60 s a launch of 2 ranks, four, and two of 1
SCRIPT = os.path.join(os.path.dirname(__file__), "upstream_checkpoints.py")
SCENARIOS = ("zero_to_fp32", "zero_to_fp32_frozen", "zero_to_fp32_frozen_params_offloaded", "immediate_save_load",
             "load_immediate_save",
             "load_into_new_engine", "loss_scale_restored", "load_saved_before_any_step", "load_into_trained_engine",
             "load_after_a_backward_without_its_step",
             "save_before_accumulation_is_done", "latest_checkpoint", "tag_validation", "integer_tag",
             "nvme_checkpointing",
             "save_for_other_world_size", "load_saved_on_cpu", "load_into_reordered_model")


# tencache's arm has the optimizer on NVMe and on cpu, stock's (the reference, CPU offload) on cpu
BEYOND_MAX_IN_CPU = "loads_params_beyond_max_in_cpu"


# in a launch of one rank, on the checkpoint save_for_other_world_size wrote at two
OTHER_WORLD_SIZE = "load_at_other_world_size"


def scenarios(tmp_path, mode, device, names, ranks=2):
    """Every scenario in one launch (each with its own engines and folders): the launch's start-up, not the
    scenarios, was most of the time when each had its own."""
    nvme, ckpt = tmp_path / f"nvme-{mode}-{device}-{ranks}", tmp_path / f"ckpt-{mode}-{device}"
    results = launch_ranks(SCRIPT, [",".join(names), mode, device, nvme, ckpt], ranks, cleanup=[nvme], forked=True,
                           stock=mode == "stock")
    # every scenario returns its findings, errors included, as a result: one that raised stopped the launch there
    # (scenarios.run_scenarios), and a test reading a later one's folder failed on a missing file, the error unsaid
    failed = {name: results.get(name, "not run: a scenario before it raised") for name in names
              if not results.get(name, {}).get("ok")}
    assert not failed, (mode, device, ranks, failed)
    return results


# saved by tencache's launch with the optimizer on NVMe, loaded by stock's with the optimizer on cpu
SAVED_ON_NVME = "saved_on_nvme"


def run_command(*args):
    """A command as a user runs it (``python -m ...``); its output. It must succeed."""
    done = subprocess.run([sys.executable, "-m", *map(str, args)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def for_cpu_copy(saved):
    """A copy of the checkpoint folder ``saved`` (``<saved>_for_cpu``), converted by `tencache-ds checkpoint-for-cpu`;
    its output."""
    shutil.copytree(saved, f"{saved}_for_cpu")
    return run_command("tencache_ds.cli.main", "checkpoint-for-cpu", f"{saved}_for_cpu/saved")


def universal(saved, on_nvme):
    """DeepSpeed's ``ds_to_universal`` of the checkpoint (tag "saved") in the folder ``saved``, into tag "universal"
    beside it; one saved with the optimizer on NVMe is made readable by it first (`tencache-ds checkpoint-for-cpu`)."""
    if on_nvme:
        run_command("tencache_ds.cli.main", "checkpoint-for-cpu", saved / "saved")
    run_command("deepspeed.checkpoint.ds_to_universal", "--input_folder", saved / "saved", "--output_folder",
                saved / "universal")


def test_optimizer_on_nvme_gives_stock_cpu_offloads_results(tmp_path):
    ours = scenarios(tmp_path, "tencache", "nvme", SCENARIOS + (SAVED_ON_NVME, BEYOND_MAX_IN_CPU))
    for_cpu = for_cpu_copy(tmp_path / "ckpt-tencache-nvme" / SAVED_ON_NVME)
    reference = scenarios(tmp_path, "stock", "cpu", SCENARIOS + (SAVED_ON_NVME, BEYOND_MAX_IN_CPU))
    # tencache's checkpoint loaded by stock CPU offload in a process that never imported tencache_ds: the weights
    # alone load and train on; the optimizer's state, whose moments are in the swap files only, stops the load
    # (its ZeRO file held them as empty tensors, which DeepSpeedCPUAdam's step wrote through: a segmentation fault);
    # from the copy `tencache-ds checkpoint-for-cpu` converted, it loads and trains on as stock CPU offload goes on
    # from its own checkpoint of the same run (load_saved_on_cpu: the same model, batches and sub-groups; tencache's
    # training has its bits), which differs from the uninterrupted run: its beta products
    on_cpu, on_nvme = reference[SAVED_ON_NVME], ours[SAVED_ON_NVME]
    assert on_cpu["ok"] and on_cpu["weights"]["loaded"] == on_nvme["trained"], (on_cpu, on_nvme)
    assert on_cpu["optimizer"]["error"].startswith("NotImplementedError") and "meta" in on_cpu["optimizer"]["error"]
    assert "2 ZeRO files now hold the optimizer state" in for_cpu, for_cpu
    assert on_cpu["converted"].get("loaded") == on_nvme["trained"], on_cpu["converted"]
    assert on_cpu["converted"] == reference["load_saved_on_cpu"]["optimizer"], (on_cpu, reference["load_saved_on_cpu"])
    # a checkpoint of 2 ranks loaded by 1: stock CPU offload refuses the optimizer's state with its own error (stock
    # NVMe copied the other size's swap files in and stopped at an assertion in its aio op), and repartitions the
    # weights alone; tencache stopped on a swap file of the wrong size in both
    universal(tmp_path / "ckpt-stock-cpu" / "save_for_other_world_size", on_nvme=False)
    universal(tmp_path / "ckpt-tencache-nvme" / "save_for_other_world_size", on_nvme=True)
    reference_other, ours_other = (scenarios(tmp_path, mode, device, [OTHER_WORLD_SIZE], ranks=1)[OTHER_WORLD_SIZE]
                                   for mode, device in (("stock", "cpu"), ("tencache", "nvme")))
    # ... and its universal version (DeepSpeed's way to another world size): stock CPU offload loads it; with the
    # optimizer on NVMe the engine looked for swap files in it (FileNotFoundError), tencache refused it. The same
    # weights, losses and trained weights, with the optimizer's state too (tencache replayed DeepSpeedCPUAdam's beta
    # products after it, as after its other loads: other trained weights, and on an Intel Xeon other losses)
    reference_universal, ours_universal = reference_other.pop("universal"), ours_other.pop("universal")
    for load in ("weights", "optimizer", "module"):
        assert "loaded" in reference_universal[load], reference_universal
        assert ours_universal[load] == reference_universal[load], (load, ours_universal, reference_universal)
    # ... and at the world size that saved it (TestZeROUniversalCheckpointDP's 2 ranks to 2): the same three loads of
    # the universal version as stock CPU offload's, and of the checkpoint itself the weights alone; with the
    # optimizer's state the same loaded weights and losses (the trained weights differ in the last bits: tencache's
    # resume replays DeepSpeedCPUAdam's beta products, stock CPU offload's recomputes them, as at "latest" below)
    reference_same, ours_same = (scenarios(tmp_path, mode, device, [OTHER_WORLD_SIZE], ranks=2)[OTHER_WORLD_SIZE]
                                 for mode, device in (("stock", "cpu"), ("tencache", "nvme")))
    assert reference_same["ok"] and ours_same["universal"] == reference_same["universal"], (ours_same, reference_same)
    assert ours_same["weights"] == reference_same["weights"], (ours_same, reference_same)
    assert all(ours_same["optimizer"][key] == reference_same["optimizer"][key] for key in ("loaded", "losses"))
    assert reference_other["ok"] and "loaded" in reference_other["weights"], reference_other
    assert ours_other["weights"] == reference_other["weights"], (ours_other, reference_other)
    stock_error = reference_other["optimizer"]["error"]
    assert stock_error.startswith("ZeRORuntimeException: The checkpoint being loaded used a DP world size of 2")
    assert ours_other["optimizer"]["error"].startswith(stock_error.rstrip(".")), ours_other["optimizer"]
    # before anything is loaded, with an error that names the limit, and the engine trains on
    # a model whose parameters are registered in another order loads the weights by name (helper-192: the masters'
    # files, placed by position, scrambled them)
    assert ours["load_into_reordered_model"]["loaded"] == ours["load_into_reordered_model"]["saved"]
    # loads without the optimizer's state with the parameters on NVMe beyond max_in_cpu (stock stops half-loaded,
    # tencache refused the module-only load and kept the saved fp32 masters at the other): stock CPU offload's bits,
    # with the optimizer on NVMe and on cpu
    for load in ("module", "weights"):
        stock_load = reference[BEYOND_MAX_IN_CPU][f"cpu_{load}"]
        assert "loaded" in stock_load, stock_load
        for optimizer_device in ("nvme", "cpu"):
            assert ours[BEYOND_MAX_IN_CPU][f"{optimizer_device}_{load}"] == stock_load, (optimizer_device, load, ours)
    # a checkpoint loaded by an engine with other sub-groups: stock CPU offload refuses the optimizer's state (torch:
    # "doesn't match the size of optimizer's group") and takes the weights; tencache adopted no file and rebuilt
    # the parameters from the live masters, the loaded weights dropped (a warning)
    other_sub_groups = ours["save_for_other_world_size"].pop("other_sub_groups_optimizer")
    stock_refusal = reference["save_for_other_world_size"].pop("other_sub_groups_optimizer")
    assert stock_refusal["error"].startswith("ValueError") and "size" in stock_refusal["error"], stock_refusal
    assert other_sub_groups["error"].startswith("TencacheError") and "sub_group_size" in other_sub_groups["error"]
    # a checkpoint saved with the optimizer on cpu: stock CPU offload loads its optimizer's state from the ZeRO file,
    # the NVMe load path reads swap files only (stock NVMe and tencache stopped with FileNotFoundError, in both
    # loads); tencache writes it into the swap files from the ZeRO file, and resumes as the run that saved it goes on
    # (stock CPU offload's own resume differs from it, in the losses with a sub-group per layer: DeepSpeedCPUAdam's
    # beta products, checkpoint.replay_adam_step_products)
    from_cpu, stock_resume = ours["load_saved_on_cpu"].pop("optimizer"), reference["load_saved_on_cpu"].pop("optimizer")
    uninterrupted = reference["load_saved_on_cpu"]["uninterrupted"]
    assert {key: from_cpu.get(key) for key in uninterrupted} == uninterrupted, (from_cpu, uninterrupted)
    assert from_cpu["loaded"] == stock_resume["loaded"], (from_cpu, stock_resume)
    # ... into an engine with other sub-groups: refused before anything is set, as stock CPU offload refuses it
    other_sub_groups = ours["load_saved_on_cpu"]["other_sub_groups"].pop("optimizer")
    assert reference["load_saved_on_cpu"]["other_sub_groups"].pop("optimizer")["error"].startswith("ValueError")
    assert other_sub_groups["error"].startswith("TencacheError") and "sub_group_size" in other_sub_groups["error"]
    # a save and a load through `latest`: the same checkpoint path and losses as stock CPU offload, and the weights
    # of the run that never stopped, which stock CPU offload's own resume misses in the last bits (DeepSpeedCPUAdam's
    # beta products, checkpoint.replay_adam_step_products)
    ours_latest = ours["latest_checkpoint"].pop("existing")
    stock_latest = reference["latest_checkpoint"].pop("existing")
    assert (ours_latest["path"], ours_latest["losses"]) == (stock_latest["path"], stock_latest["losses"])
    assert ours_latest["trained"] == reference["latest_checkpoint"]["uninterrupted"]["trained"], ours_latest
    # TestNVMeCheckpointing's five placements: the losses of the run and of its resume, and the loss after both, as
    # stock CPU offload's; the resumed weights are the run that never stopped where the optimizer is offloaded (stock
    # CPU offload's resume misses them in the last bits: its beta products), and stock's own resume's where it is not
    # (the optimizer is then stock's, as are its losses)
    placements = ours["nvme_checkpointing"].pop("placements")
    for name, reference_run in reference["nvme_checkpointing"].pop("placements").items():
        run = placements[name]
        assert {key: run[key] for key in ("losses", "last", "equal")} == \
            {key: reference_run[key] for key in ("losses", "last", "equal")}, (name, run, reference_run)
        uninterrupted, resumed = run["trained"]
        assert uninterrupted == reference_run["trained"][0], (name, run, reference_run)
        assert resumed == (reference_run["trained"][1] if name.endswith("optimizer=none") else uninterrupted), name
    # a tag of each rank's own: refused on every rank before any file is written ("FAIL"), saved by each ("WARN")
    tags = reference["tag_validation"]
    assert (tags["FAIL"]["refused"], tags["FAIL"]["written"], tags["WARN"]["own_zero_file"]) == (True, False, True)
    assert tags["unknown"] == "DeepSpeedConfigError", tags
    assert reference["loss_scale_restored"] == {"ok": True, "scale_before_load": 1.0, "scale_after_load": 4.0}
    # frozen fragments saved as placeholders (stock NVMe's, tencache's before 2026-12-07): the weights stay (tencache's
    # arm only: stock CPU offload's saves hold the fragments)
    assert ours["zero_to_fp32_frozen_params_offloaded"].pop("placeholders_keep_weights") is True
    for name in SCENARIOS:
        assert name in reference and name in ours, (name, reference, ours)  # a failure stops the scenarios after it
        assert reference[name]["ok"], (name, reference[name])
        assert ours[name] == reference[name], name
        if name.startswith("zero_to_fp32"):
            assert ours[name]["loaded_equals_trained"] and ours[name]["fp32"] == ours[name]["trained"], name
            for load in ("reloaded", "reloaded_weights_only"):
                assert ours[name].get(load, ours[name]["trained"]) == ours[name]["trained"], (name, load)
