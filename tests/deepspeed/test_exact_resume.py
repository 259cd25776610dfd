"""A resume under tencache gives the uninterrupted run's bits: save after 2 of 4 steps, resume for the last 2, and
the resumed losses and final fp32 weights are those of the run that never stopped. With one optimizer sub-group and
with several, the optimizer on NVMe and on cpu (parameters on NVMe), a frozen base model at two ranks, and the two
parameter groups Hugging Face's Trainer makes. Real engine, real files.

What the checkpoint did not carry (integrations/deepspeed/checkpoint.py): on NVMe, Adam's step counts and moment
registrations (stock's NVMe load path skips the optimizer's state dict); on either device, DeepSpeedCPUAdam's
running products beta^t, which a fresh process recomputes with pow() at its first update (the last bits differ,
and with them every loss from the second resumed step on)."""
import json
import os
import re

import pytest

from conftest import result_of, run_helper  # tests/deepspeed/conftest.py
from test_residency import FAST, PREFIX  # fp32 (why: there); tests/deepspeed is on sys.path (rootdir-relative imports)

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]  # about 50 s each (two training runs)

AUTO = {}
SUB_GROUPS = {"one": {}, "many": {"sub_group_size": 2e6}}  # gpt2-tiny: 1 sub-group at stock's 1e9, 8 at 2e6


@pytest.mark.parametrize("sub_groups", list(SUB_GROUPS))
@pytest.mark.parametrize("optimizer_device", ["nvme", "cpu"])
def test_resume_gives_the_uninterrupted_runs_bits(train, tmp_path, optimizer_device, sub_groups):
    options = dict(FAST, optimizer_offload_device=optimizer_device, **SUB_GROUPS[sub_groups])
    folder = str(tmp_path / "ckpt")
    metrics = tmp_path / "metrics.jsonl"  # both runs append to it, as a run resumed with its own config does
    block = dict(AUTO, metrics_path=str(metrics))
    uninterrupted = train(block=block, steps=4, save_after=2, checkpoint_dir=folder, **options)
    resumed = train(block=block, steps=2, resume=True, checkpoint_dir=folder, **options)
    assert resumed.last_stats["tencache_enabled"] == 1
    assert [step["step"] for step in resumed.result["steps"]] == [2, 3]
    assert resumed.loss_bits == uninterrupted.loss_bits[2:]
    assert resumed.result["weights_sha256"] == uninterrupted.result["weights_sha256"]
    # one metrics record per optimizer step, numbered as the engine numbers its steps: the resumed run's go on from
    # step 2 (they restarted at 0 before 2026-12-02, and its first held the load's I/O)
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [0, 1, 2, 3, 2, 3]


def test_resume_with_a_prefix_held_at_the_save_gives_the_uninterrupted_runs_bits(train, tmp_path):
    """A budget smaller than one optimizer tensor holds the first bytes of one (test_residency.py PREFIX), newer
    than its file at the save: the save writes them before it links the files, the next write of that tensor goes
    to a file of its own (the checkpoint keeps its bytes), and the resume reads the checkpoint's."""
    options = dict(FAST, optimizer_offload_device="nvme")
    folder = str(tmp_path / "ckpt")
    uninterrupted = train(block=PREFIX, steps=4, save_after=2, checkpoint_dir=folder, **options)
    assert uninterrupted.last_stats["optimizer_cache_prefix_tensors"] == 1
    resumed = train(block=PREFIX, steps=2, resume=True, checkpoint_dir=folder, **options)
    assert [step["step"] for step in resumed.result["steps"]] == [2, 3]
    assert resumed.loss_bits == uninterrupted.loss_bits[2:]
    assert resumed.result["weights_sha256"] == uninterrupted.result["weights_sha256"]


def test_resume_of_a_frozen_base_model_at_two_ranks_gives_the_uninterrupted_runs_bits(train, tmp_path):
    """Most parameters frozen (no fp32 master: the ZeRO file keeps them among its frozen fragments), parameters and
    optimizer on NVMe, 2 ranks: the run that saves forked as the launcher starts them (tests/deepspeed/forkserver.py),
    the resume through the launcher."""
    options = dict(FAST, train_only="ln_|bias|wpe", launcher="deepspeed", num_ranks=2, seq_len=32, micro_batch=1,
                   timeout=600)
    folder = str(tmp_path / "ckpt")
    uninterrupted = train(block=AUTO, steps=4, save_after=2, checkpoint_dir=folder, **dict(options, launcher="ranks"))
    resumed = train(block=AUTO, steps=2, resume=True, checkpoint_dir=folder, **options)
    assert [step["step"] for step in resumed.result["steps"]] == [2, 3]
    assert resumed.loss_bits == uninterrupted.loss_bits[2:]
    assert resumed.result["weights_sha256"] == uninterrupted.result["weights_sha256"]


def lost_moment_files(swap_folder, count):
    """Delete the last ``count`` second-moment files of a checkpoint's rank folder; their paths."""
    lost = sorted(os.path.join(swap_folder, name) for name in os.listdir(swap_folder)
                  if name.startswith("exp_avg_sq-"))[-count:]
    assert len(lost) == count, os.listdir(swap_folder)
    for path in lost:
        os.unlink(path)
    return lost


def test_a_resume_from_a_save_cut_short_among_its_master_files_says_the_checkpoint_is_incomplete(train, tmp_path):
    """helper-237: a save stopped while it placed the master files (they come first: a kill, a full disk), or a
    copy that lost some, was refused as a change of layout ("other sub-groups": did sub_group_size change?) though
    the ZeRO file describes this engine's sub-groups. It says the checkpoint is incomplete now."""
    options = dict(FAST, optimizer_offload_device="nvme", seq_len=32, micro_batch=1, timeout=300, **SUB_GROUPS["many"])
    folder = str(tmp_path / "ckpt")
    train(block=AUTO, steps=3, save_after=2, checkpoint_dir=folder, **options)
    rank_folder = os.path.join(folder, "ckpt", "offloaded_tensors", "rank00")
    masters = sorted(name for name in os.listdir(rank_folder) if re.fullmatch(r"\d+_\d+\.tensor\.swp", name))
    assert len(masters) > 2, os.listdir(rank_folder)
    for name in masters[2:]:
        os.unlink(os.path.join(rank_folder, name))
    stopped = train(block=AUTO, steps=1, resume=True, checkpoint_dir=folder, expect_failure=True, **options)
    assert (f"the checkpoint is incomplete: its ZeRO file describes {len(masters)} optimizer sub-groups swapped at "
            f"the save, and {rank_folder} holds the master files of 2.") in stopped.output, stopped.output[-3000:]


def test_a_resume_from_a_checkpoint_that_lost_moment_files_stops_on_every_rank_naming_them(train, tmp_path):
    """Regression test: a checkpoint whose swap folder lacks moment files its ZeRO file describes (a save that did
    not finish on every rank, a copy that lost files) was loaded with a warning, and Adam started over for those
    sub-groups. Now the load stops before it places any file, naming them (integrations/deepspeed/saved_layout.py),
    at 2 ranks on both, each saying why: rank 0's files are all there, and were rank 1 to stop alone, rank 0 would
    go on into the load's next collective (where DeepSpeed's launcher kills it, and another launcher may leave it
    waiting). The run that saves forked as the launcher starts its ranks (tests/deepspeed/forkserver.py), the
    resume through the launcher."""
    options = dict(FAST, optimizer_offload_device="nvme", num_ranks=2, seq_len=32, micro_batch=1, timeout=300,
                   **SUB_GROUPS["many"])
    folder = str(tmp_path / "ckpt")
    train(block=AUTO, steps=3, save_after=2, checkpoint_dir=folder, launcher="ranks", **options)
    lost = lost_moment_files(os.path.join(folder, "ckpt", "offloaded_tensors", "rank01"), 2)
    stopped = train(block=AUTO, steps=1, resume=True, checkpoint_dir=folder, launcher="deepspeed",
                    expect_failure=True, **options)
    assert "the checkpoint is incomplete: 2 optimizer state file(s) that its ZeRO file describes" in stopped.output
    assert all(path in stopped.output for path in lost)
    assert "No swap file was placed and no optimizer state set" in stopped.output
    assert "another rank refused the checkpoint's optimizer swap files" in stopped.output


def test_resume_with_a_scheduler_that_cycles_the_betas_gives_the_uninterrupted_runs_bits(train, tmp_path):
    """Regression test (helper-222's review): DeepSpeed's OneCycle scheduler cycles beta1 every step (its default
    cycle_momentum), so the C++ optimizer recomputes its beta products with ``pow`` at each update. The resume
    replayed the saved step counts with the saved betas (the next step's, the scheduler having stepped): other
    products, other losses from the second resumed step on, where stock CPU offload's resume gave the right ones.
    The products' state is saved in the ZeRO file and replayed (adam_beta_products.py)."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "stock-nvme.json")) as handle:
        config = json.load(handle)
    config["scheduler"] = {"type": "OneCycle", "params": {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 2, "cycle_momentum": True,
        "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}}
    path = tmp_path / "one-cycle.json"
    path.write_text(json.dumps(config))
    options = dict(FAST, sub_group_size=2e6)
    folder = str(tmp_path / "ckpt")
    uninterrupted = train(config=str(path), block=AUTO, steps=5, save_after=2, checkpoint_dir=folder, **options)
    resumed = train(config=str(path), block=AUTO, steps=3, resume=True, checkpoint_dir=folder, **options)
    assert resumed.loss_bits == uninterrupted.loss_bits[2:]
    assert resumed.result["weights_sha256"] == uninterrupted.result["weights_sha256"]


def test_resume_with_the_trainers_two_parameter_groups_gives_the_uninterrupted_runs_bits(train, tmp_path):
    """Hugging Face's Trainer hands DeepSpeed two parameter groups (weight decay for weights, none for biases and
    layer norms): stage 3 makes sub-groups per group, each stepped with its group's settings."""
    options = dict(FAST, trainer_param_groups=True, sub_group_size=2e6)
    folder = str(tmp_path / "ckpt")
    stock = train(block=None, steps=4, **options)
    uninterrupted = train(block={"host_cache_bytes": "40MB"}, steps=4, save_after=2, checkpoint_dir=folder, **options)
    assert uninterrupted.loss_bits == stock.loss_bits
    assert uninterrupted.result["weights_sha256"] == stock.result["weights_sha256"]
    resumed = train(block={"host_cache_bytes": "40MB"}, steps=2, resume=True, checkpoint_dir=folder, **options)
    assert [step["step"] for step in resumed.result["steps"]] == [2, 3]
    assert resumed.loss_bits == uninterrupted.loss_bits[2:]
    assert resumed.result["weights_sha256"] == uninterrupted.result["weights_sha256"]


def test_a_save_before_any_step_after_a_load_describes_the_moments_and_resumes_as_the_loaded_checkpoint(tmp_path):
    """Regression test (helper-192): a fresh engine that loaded a checkpoint and saved at once (a preemption
    handler's save, a re-tag script) wrote the moments into its ZeRO file as full-size tensors of no set value (set
    from the load as placeholders, registered only at the next swap-in): a stock CPU offload load or `tencache-ds
    checkpoint-for-cpu` took them for Adam's. They are described (meta tensors) as after a step now, and the second
    checkpoint resumes as the first does. Each stage a process of its own (save_after_load.py)."""
    script = os.path.join(os.path.dirname(__file__), "save_after_load.py")

    def stage(*args):
        proc = run_helper(script, list(args))
        result = result_of(proc.stdout)
        assert result is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
        return result

    checkpoint = tmp_path / "checkpoint"
    uninterrupted = stage("train", tmp_path / "nvme-train", checkpoint)
    assert stage("resave", tmp_path / "nvme-resave", checkpoint) == {"described": True, "moments": 6}
    resumed = {tag: stage("resume", tmp_path / f"nvme-{tag}", checkpoint, tag)["losses"] for tag in ("first", "second")}
    assert resumed["first"][0] == uninterrupted["loss"] and resumed["second"] == resumed["first"], resumed
