"""The fp32 masters filled from the parameter partitions (integrations/deepspeed/master_copies.py): a model trained
in fp32 whose parameter partitions the host tier holds, and whose optimizer state it cannot hold, reads no master
from its file in steady state, and trains with stock's bits. Real engine, real files; the reference never imported
tencache_ds."""
import glob
import hashlib
import json
import os
import re

import pytest
import torch

from tencache_ds.io import save_from_files
from test_parity import assert_identical, assert_same_bits
from test_zero_to_fp32 import assert_bit_for_bit, consolidate, zero_files_saved

pytestmark = pytest.mark.deepspeed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# gpt2-tiny in fp32: 61 MB of parameter partitions, 182 MB of masters and moments in 6 swapped sub-groups; 100 MB of
# host tier holds the partitions and a few of the optimizer's tensors
OPTIONS = dict(dtype="fp32", steps=4, sub_group_size=2_000_000)
PARTITIONS_HELD = {"host_cache_bytes": "100MB"}
# ... and 70 MB fewer of the optimizer's
PARTITIONS_HELD_ONLY = {"host_cache_bytes": "70MB"}
# the masters written behind reach their files one after the other, a second apart (slow_master_writes/)
SLOW_MASTER_WRITES = {"SLOW_MASTER_WRITES_S": "1",
                      "PYTHONPATH": os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_master_writes")}


# "ranks": the rank forked as the launcher starts it (through the launcher itself the two runs took 67 s)
@pytest.mark.parametrize("grad_accum, launcher", [(1, "python"), (2, "ranks")])
def test_masters_filled_from_held_partitions_train_with_stocks_bits_and_are_not_read(train, grad_accum, launcher):
    stock = train(block=None, grad_accum=grad_accum, launcher=launcher, **OPTIONS)
    ours = train(block=PARTITIONS_HELD, grad_accum=grad_accum, launcher=launcher, **OPTIONS)
    assert_identical(stock, ours)
    steps = [step["stats"] for step in ours.result["steps"]]
    filled = [0] + [stats["optimizer_masters_from_partitions"] for stats in steps]
    # stage 3 copied every master into the partitions at initialisation: from the first training step on, each
    # update fills the masters the optimizer tier does not hold
    assert all(after > before for before, after in zip(filled, filled[1:])), filled
    # from the second step on the tier keeps moments, not masters (a filled master saves only its write kept:
    # plan/eviction.CopiesElsewhere), so every one of the 6 swapped sub-groups' masters is filled each step
    assert [after - before for before, after in zip(filled[2:], filled[3:])] == [6, 6], filled
    assert steps[-1]["optimizer_cache_copied"] == filled[-1]  # each a read the drive did not do
    assert steps[-1]["optimizer_master_bytes_from_partitions"] > 0
    # ... and none is written: their files stay behind the partitions, owed, while nothing needs them
    # (master_write_behind.py)
    assert [stats["optimizer_masters_written_behind"] for stats in steps] == [0] * len(steps)
    assert [stats["optimizer_masters_owed"] for stats in steps][2:] == [6] * (len(steps) - 2)


def test_with_pipeline_write_off_the_masters_filled_from_partitions_are_written_in_the_update(train, tmp_path):
    """``offload_optimizer.pipeline_write: false`` given explicitly turns writing behind off (plan/host_tier.py
    optimizer_pipelining, which the step model reads too): the update writes what it changed, each filled master as
    well, so no master is ever owed its file; stock's bits either way."""
    with open(os.path.join(REPO, "configs", "stock-nvme.json")) as source:
        config = json.load(source)
    config["zero_optimization"]["offload_optimizer"]["pipeline_write"] = False
    path = tmp_path / "pipeline-write-off.json"
    path.write_text(json.dumps(config))
    stock = train(config=str(path), block=None, **OPTIONS)
    ours = train(config=str(path), block=PARTITIONS_HELD, **OPTIONS)
    assert_identical(stock, ours)
    steps = [step["stats"] for step in ours.result["steps"]]
    assert steps[-1]["optimizer_masters_from_partitions"] > 0  # filled from the partitions, as with writes behind
    assert [stats["optimizer_masters_owed"] for stats in steps] == [0] * len(steps)


def test_weights_edited_between_updates_are_not_undone_by_a_fill_from_stale_partitions(train):
    """After step 1 a user halves half the weights' fp32 masters through safe_set_full_fp32_param and the last
    weight's parameter inside GatheredParameters (scripts/train.py --edit-weights-after-step): each leaves
    sub-groups' masters and partitions apart, so the next update reads those masters from their files, and the later
    ones fill them again from the partitions stage 3 copies them into: stock's bits. (The gather's edit, left
    unnoticed, fails it: checked by breaking the partitions' write counts. The masters set through the API are
    written back changed right before that update, and the tier then holds them: their rule is checked in
    tests/cache/test_copy_validity.py.)"""
    options = dict(OPTIONS, steps=4, edit_weights_after_step=1)
    stock = train(block=None, **options)
    ours = train(block=PARTITIONS_HELD_ONLY, **options)
    assert_identical(stock, ours)
    assert ours.last_stats["optimizer_masters_from_partitions"] > 0


def test_weights_edited_while_masters_are_written_behind_are_not_written_into_them(train):
    """The same edits after step 3, whose update's masters are owed to their files (master_write_behind.py), and
    written from the partitions a second apart when something needs them (SLOW_MASTER_WRITES: the last sub-group's,
    whose weight the gather edits, after the others'): at one rank on a host accelerator GatheredParameters hands the
    partition itself, which the edit changes in place, so those writes are made and waited for when the context is
    entered (install.py). (Without that wait the master files took the edited bytes, and the next update read them:
    not stock's bits.)"""
    options = dict(OPTIONS, steps=5, edit_weights_after_step=3)
    stock = train(block=None, **options)
    ours = train(block=PARTITIONS_HELD_ONLY, env=SLOW_MASTER_WRITES, **options)
    assert_identical(stock, ours)
    owed = [step["stats"]["optimizer_masters_owed"] for step in ours.result["steps"]]
    behind = [step["stats"]["optimizer_masters_written_behind"] for step in ours.result["steps"]]
    assert owed[3] > 0 and behind[3] == 0, (owed, behind)  # step 3's masters were owed when the edits came
    assert behind[4] > behind[3], behind  # ... and written then


def test_at_two_ranks_each_rank_fills_the_masters_of_its_own_partitions_with_stock_cpu_offloads_bits(train,
                                                                                                     tmp_path):
    """2 ranks, each with its own partitions and masters (stock NVMe drifts there with the optimizer on NVMe and
    stops with the parameters on it: the reference is stock CPU offload, as in test_residency.py). Both save after
    step 2: each rank's ZeRO file takes its masters from its own partitions (none copied from a file on this ext4),
    and the checkpoint consolidates to the reference's fp32 weights bit for bit."""
    options = dict(OPTIONS, launcher="ranks", num_ranks=2, steps=3, seq_len=32, micro_batch=1, save_after=2)
    reference = train(block=None, offload_device="cpu", checkpoint_dir=str(tmp_path / "reference"), **options)
    ours = train(block={"host_cache_bytes": "50MB"}, checkpoint_dir=str(tmp_path / "ours"), **options)
    assert_same_bits(reference, ours)
    assert ours.last_stats["optimizer_masters_from_partitions"] > 0
    if save_from_files.supported():  # one ZeRO file a rank, each in the two-pass save, nothing copied from a file
        zero_files = zero_files_saved(ours)
        assert len(zero_files) == 2 and all(copied == 0 for _shared, copied, _written in zero_files.values()), \
            zero_files
    assert_bit_for_bit(consolidate(str(tmp_path / "ours")), consolidate(str(tmp_path / "reference")), "2 ranks")


def test_a_resume_from_a_save_right_after_masters_were_written_behind_gives_the_uninterrupted_runs_bits(train,
                                                                                                       tmp_path):
    """The save before step 3 comes while the updates' masters are owed to their files (written from the partitions
    only where something needs them: master_write_behind.py), here landing a second apart (SLOW_MASTER_WRITES): it
    writes them and waits for those writes before it reads the master files into the ZeRO file and links the
    folder, and the resume from it gives the uninterrupted run's bits, which are stock's. (Without those waits the
    checkpoint held older masters and the resumed losses differed.)"""
    folder = str(tmp_path / "ckpt")
    options = dict(OPTIONS, steps=5)
    stock = train(block=None, **options)
    uninterrupted = train(block=PARTITIONS_HELD, save_after=3, checkpoint_dir=folder, env=SLOW_MASTER_WRITES,
                          **options)
    assert_identical(stock, uninterrupted)
    owed = [step["stats"]["optimizer_masters_owed"] for step in uninterrupted.result["steps"]]
    behind = [step["stats"]["optimizer_masters_written_behind"] for step in uninterrupted.result["steps"]]
    assert owed[2] > 0 and behind[2] == 0, (owed, behind)  # the third update's masters were owed when the save came
    assert behind[3] > behind[2], behind  # ... and the save wrote them
    # the ZeRO file took the masters from the partitions, not from the files just written (io/save_from_files.py;
    # on a file system that clones, their blocks are shared instead), and holds what those files hold, bit for bit
    if save_from_files.supported():
        stats = uninterrupted.last_stats
        assert (stats["optimizer_checkpoint_zero_files_from_swap_files"],
                stats["optimizer_checkpoint_zero_file_copied_bytes"]) == (1, 0), stats
    assert_zero_file_masters_are_the_master_files(folder)
    resumed = train(block=PARTITIONS_HELD, **dict(options, steps=2), resume=True, checkpoint_dir=folder)
    assert [step["step"] for step in resumed.result["steps"]] == [3, 4]
    assert resumed.loss_bits == uninterrupted.loss_bits[3:]
    assert resumed.result["weights_sha256"] == uninterrupted.result["weights_sha256"]


def test_masters_whose_partitions_stream_are_read_from_the_partitions_files_never_written_and_resume_exactly(
        train, tmp_path):
    """No host tier (and no device tier, which at one rank here keeps the partitions themselves): the partitions
    stream, each written to its own file after its update. Those files then hold the new masters, so an update's
    master goes back unwritten, owed, and the next update reads it from the partitions' files (master_write_behind.py,
    master_copies.py): stock's bits, with no master written in a step. A save before step 3 writes the owed masters
    from those files (landing a second apart: SLOW_MASTER_WRITES), its ZeRO file from the same copies, and the resume
    gives the uninterrupted run's bits. (Before, every master was written in its update where any partition
    streamed: 0 owed, nothing read from partitions.)"""
    folder = str(tmp_path / "ckpt")
    options = dict(OPTIONS, steps=5)
    streamed = {"host_cache_bytes": 0, "device_cache_bytes": 0}
    stock = train(block=None, **options)
    uninterrupted = train(block=streamed, save_after=3, checkpoint_dir=folder, env=SLOW_MASTER_WRITES, **options)
    assert_identical(stock, uninterrupted)
    steps = [step["stats"] for step in uninterrupted.result["steps"]]
    owed = [stats["optimizer_masters_owed"] for stats in steps]
    behind = [stats["optimizer_masters_written_behind"] for stats in steps]
    from_files = [stats["optimizer_master_bytes_read_from_partition_files"] for stats in steps]
    assert owed[2] == 6 and behind[2] == 0, (owed, behind)  # every swapped master owed, none written in a step
    assert from_files[1] < from_files[2] and from_files[2] > 0, from_files  # ... and read from the partitions
    assert behind[3] > behind[2], behind  # the save wrote them
    # ... reading them from the partitions' files, a settle's reads, not an update's: the stat counts only updates'
    # (bench/report_bound.py takes it from the store's copied bytes, which count no settle). The update after the
    # save reads the masters' own files, current then, and the next one owes them again
    assert from_files[3] == from_files[2] < from_files[4], from_files
    if save_from_files.supported():  # ... and its ZeRO file wrote them from the copies those settles filled, as
        # they were written: no master read back from the file just written (before, 60624896 bytes copied from them)
        settled = steps[3]["optimizer_checkpoint_zero_file_written_with_master_settle_bytes"]
        written = steps[3]["optimizer_master_bytes_written_behind"] - steps[2]["optimizer_master_bytes_written_behind"]
        assert settled == written > 0, (settled, written)
        assert steps[3]["optimizer_checkpoint_zero_file_copied_bytes"] == 0, steps[3]
        # masters filled while the one before was written (MasterSources.settled_after): all but the first of those
        # filled from a copy (here 3 of 6: the last layers' partitions are still in host memory at the save, and
        # those masters are written from them)
        filled_ahead = steps[3]["optimizer_masters_filled_ahead"] - steps[2]["optimizer_masters_filled_ahead"]
        assert 0 < filled_ahead < owed[2], (filled_ahead, owed)
    assert_zero_file_masters_are_the_master_files(folder)
    resumed = train(block=streamed, **dict(options, steps=2), resume=True, checkpoint_dir=folder)
    assert [step["step"] for step in resumed.result["steps"]] == [3, 4]
    assert resumed.loss_bits == uninterrupted.loss_bits[3:]
    assert resumed.result["weights_sha256"] == uninterrupted.result["weights_sha256"]


def assert_zero_file_masters_are_the_master_files(checkpoint_dir, rank: int = 0):
    """Every master swap file of ``rank`` in the checkpoint (``<ds_id>.tensor.swp``) holds one of its ZeRO file's
    fp32 groups in its first bytes, bit for bit (the files are what the resume reads; the ZeRO file, what zero_to_fp32
    reads)."""
    zero_files = glob.glob(os.path.join(checkpoint_dir, "*", f"zero_pp_rank_{rank}_*optim_states.pt"))
    assert len(zero_files) == 1, zero_files
    groups = torch.load(zero_files[0], weights_only=False)["optimizer_state_dict"]["fp32_flat_groups"]
    by_size = {}
    for group in groups:
        by_size.setdefault(group.numel() * 4, set()).add(hashlib.sha256(group.detach().numpy().tobytes()).hexdigest())
    master_files = [path for path in glob.glob(os.path.join(checkpoint_dir, "**", f"rank{rank:02d}", "*.tensor.swp"),
                                               recursive=True)
                    if re.fullmatch(r"\d+_\d+\.tensor\.swp", os.path.basename(path))]
    assert master_files
    for path in master_files:
        with open(path, "rb") as handle:
            data = handle.read()
        assert any(hashlib.sha256(data[:size]).hexdigest() in hashes for size, hashes in by_size.items()), path


def test_at_two_ranks_each_rank_writes_its_streaming_masters_to_both_files_from_one_fill_and_resumes_exactly(
        train, tmp_path):
    """The save's masters settled by the ZeRO file's writer (checkpoint_save.MasterSources) at two ranks, ranks
    forked as the launcher starts them: each rank writes its own owed masters into its swap files and its ZeRO file
    from the copies its settles fill (no master copied back from a file), the checkpoint's master files equal its
    ZeRO file's, the run and its checkpoint consolidated with zero_to_fp32 equal stock's with both offloads on CPU
    at 2 ranks bit for bit (stock NVMe crashes there with parameters on NVMe; a process that never imported
    tencache_ds), and the resume gives the uninterrupted run's bits on both ranks' weights."""
    folder, stock_folder = str(tmp_path / "ckpt"), str(tmp_path / "ckpt-stock-cpu")
    streamed = {"host_cache_bytes": 0, "device_cache_bytes": 0}
    options = dict(OPTIONS, steps=5, launcher="ranks", num_ranks=2)
    stock = train(block=None, save_after=3, checkpoint_dir=stock_folder, offload_device="cpu", **options)
    uninterrupted = train(block=streamed, save_after=3, checkpoint_dir=folder, **options)
    assert uninterrupted.loss_bits == stock.loss_bits
    assert uninterrupted.result["weights_sha256"] == stock.result["weights_sha256"] is not None
    assert_bit_for_bit(consolidate(folder), consolidate(stock_folder), "2 ranks, masters settled by the writer")
    at_save = uninterrupted.result["steps"][3]["stats"]
    if save_from_files.supported():
        assert at_save["optimizer_checkpoint_zero_file_written_with_master_settle_bytes"] > 0, at_save
        assert at_save["optimizer_checkpoint_zero_file_copied_bytes"] == 0, at_save
    for rank in range(2):
        assert_zero_file_masters_are_the_master_files(folder, rank)
    resumed = train(block=streamed, **dict(options, steps=2), resume=True, checkpoint_dir=folder)
    assert [step["step"] for step in resumed.result["steps"]] == [3, 4]
    assert resumed.loss_bits == uninterrupted.loss_bits[3:]
    assert resumed.result["weights_sha256"] == uninterrupted.result["weights_sha256"]
