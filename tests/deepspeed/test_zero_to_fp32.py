"""DeepSpeed's own consolidation (`deepspeed.utils.zero_to_fp32`) of a checkpoint saved under tencache gives stock
CPU offload's fp32 weights bit for bit, with the optimizer on CPU or on NVMe (stock's own NVMe-optimizer checkpoint
cannot be consolidated: its fp32 groups are the swapped-out placeholders; tencache's ZeRO file holds the masters,
integrations/deepspeed/checkpoint_save.py). On a file system that clones ranges the masters in the ZeRO file share the
swap files' blocks instead of being written, and the steps after the save leave them alone. Real engine, real files."""
import contextlib
import os
import re
import shutil
import warnings

import pytest
import torch
from conftest import unshare_mounts
from tencache_ds.io import save_from_files

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]  # about 20 s a training run

QUARTER = {"host_cache_bytes": 70_000_000}  # evictions: some partitions held dirty, some on file, at the save
STREAMING = {"host_cache_bytes": 0}  # every master on file at the save
QUEUED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "queued_checkpoint.py")
FAST = dict(dtype="fp32", weights_gather="none")  # fp32: see test_residency.py
HASHED = dict(FAST, weights_gather="grouped")  # runs whose final fp32 weights are compared (sha256 of every master)


def consolidate(checkpoint_dir):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    try:
        return get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag="ckpt")
    except ValueError as err:  # "consumed N numels out of 0 - something is wrong"
        return err


def assert_bit_for_bit(ours, stock, name):
    assert isinstance(ours, dict), (name, ours)
    assert list(ours) == list(stock), name
    for key, tensor in stock.items():
        assert ours[key].dtype == tensor.dtype == torch.float32, (name, key)
        assert ours[key].shape == tensor.shape, (name, key)
        assert torch.equal(ours[key].view(torch.int32), tensor.view(torch.int32)), f"{name}: {key} differs"


def zero_files_saved(run) -> dict:
    """{ZeRO file name: (bytes shared with the swap files, bytes copied from them, bytes written from memory)}, from
    the run's log lines, every rank's (integrations/deepspeed/checkpoint_save.py)."""
    found = [re.search(r"ZeRO file \S*/(\S+): (\d+) bytes shared with the swap files, (\d+) copied from them, "
                       r"(\d+) written from memory", line)
             for line in run.output.splitlines() if "shared with the swap files" in line]
    return {match.group(1): tuple(int(match.group(i)) for i in (2, 3, 4)) for match in found if match}


@contextlib.contextmanager
def folder_on(file_system_folder, name):
    """A folder of its own on the XFS image, removed afterwards."""
    folder = os.path.join(file_system_folder, f"{name}-{os.getpid()}")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_zero_to_fp32_of_a_tencache_checkpoint_is_stock_cpu_offloads_bit_for_bit(train, tmp_path):
    """Checkpoints saved after 1 of 2 steps: stock's with the optimizer on CPU, tencache's with it on CPU and on NVMe,
    and on NVMe through checkpoint engines that serialise after their save returns (queued_checkpoint.py: DeepSpeed's
    decoupled writer's way, with the masters the host tier holds; and one that writes at the commit, DataStates' way,
    every master streamed from its file): those are given copies, in a state dict of the engine's own
    (checkpoint_save.masters_shown; before, a mapped master failed to pickle: OSError, Bad file descriptor; and the
    engine writing at the commit found the placeholders put back: "consumed ... numels out of 0").
    The queued run has a /dev/shm of 16 MiB, as a container caps it, where the masters are 61 MB: the queue moved
    anonymous copies into /dev/shm and the save stopped ("unable to allocate shared memory"); the copies are
    file-backed now. Torch's own engine takes the masters on file from their swap files (copied through O_DIRECT on this
    machine's ext4: io/save_from_files.py), or from the parameter partitions that hold them (fp32). One test: the
    stock run is the reference of all."""
    small_shm = unshare_mounts()
    if not small_shm:
        warnings.warn("this machine does not let a run mount a /dev/shm of its own (unshare --mount): the queued run "
                      "has the machine's /dev/shm")
    states, losses = {}, {}
    queued = {"script": QUEUED, "timeout": 300, **({"shm_size": "16m"} if small_shm else {})}
    # an engine that writes when the save is committed, after the save returned (DataStates' way): it was handed
    # stage 3's live objects, out of which the masters' copies and the moments' descriptions had gone again
    at_commit = {"script": QUEUED, "env": {"TENCACHE_TEST_CHECKPOINT_ENGINE": "at_commit"}}
    for name, block, device, script in (("stock", None, "cpu", None), ("ours-cpu", QUARTER, "cpu", None),
                                        ("ours-nvme", QUARTER, "nvme", None),
                                        ("ours-nvme-queued", QUARTER, "nvme", queued),
                                        ("ours-nvme-streaming-written-at-commit", STREAMING, "nvme", at_commit)):
        folder = str(tmp_path / f"ckpt-{name}")
        run = train(block=block, steps=2, save_after=1, checkpoint_dir=folder, optimizer_offload_device=device,
                    **FAST, **(script or {}))
        if block is not None:
            assert run.last_stats["tencache_enabled"] == 1
        # torch's engine: the masters in the two-pass save (on this ext4 copied from their files, or gathered from
        # the parameter partitions that hold them)
        if name == "ours-nvme" and save_from_files.supported():
            stats = run.last_stats
            assert (stats["optimizer_checkpoint_zero_files_from_swap_files"],
                    stats["optimizer_checkpoint_zero_files_saved_usual_way"]) == (1, 0), stats
            assert stats["optimizer_checkpoint_zero_file_copied_bytes"] + \
                stats["optimizer_checkpoint_zero_file_shared_bytes"] + \
                stats["optimizer_checkpoint_zero_file_written_bytes"] > 1_000_000, stats
        states[name], losses[name] = consolidate(folder), run.loss_bits
    stock = states.pop("stock")
    assert isinstance(stock, dict) and len(stock) > 10, stock
    for name, ours in states.items():
        assert_bit_for_bit(ours, stock, name)
        assert losses[name] == losses["stock"], name  # the step after the save too


def test_where_the_file_system_clones_the_masters_share_the_swap_files_blocks(train, tmp_path, reflink_folder):
    """Saved after 1 of 3 steps on an XFS image: the ZeRO file's masters are the swap files' blocks, nothing of them
    is written, and after two more steps (evictions rewrite the swap files) the checkpoint still consolidates to
    stock CPU offload's weights after step 1, and a resume from it gives the uninterrupted run's last two losses and
    final fp32 weights, bit for bit."""
    stock_folder = str(tmp_path / "ckpt-stock")
    stock = train(block=None, steps=2, save_after=1, checkpoint_dir=stock_folder, optimizer_offload_device="cpu",
                  **FAST)
    with folder_on(reflink_folder, "zero-to-fp32") as folder:
        run = train(block=QUARTER, steps=3, save_after=1, checkpoint_dir=os.path.join(folder, "ckpt"),
                    nvme_path=os.path.join(folder, "nvme"), optimizer_offload_device="nvme", **HASHED)
        assert run.loss_bits[:2] == stock.loss_bits  # the save changed nothing the steps compute
        [(shared, copied, written)] = zero_files_saved(run).values()
        assert shared > 10_000_000 and copied + written < 100_000, (shared, copied, written)  # the masters; the rest
        stats = run.last_stats  # the same, in the swapper's stats: one ZeRO file shared, every swap file linked
        assert (stats["optimizer_checkpoint_zero_files_from_swap_files"],
                stats["optimizer_checkpoint_zero_files_saved_usual_way"],
                stats["optimizer_checkpoint_zero_file_shared_bytes"]) == (1, 0, shared), stats
        assert stats["optimizer_checkpoint_folder_files"] == stats["optimizer_checkpoint_folder_files_linked"] > 0
        assert_bit_for_bit(consolidate(os.path.join(folder, "ckpt")), consolidate(stock_folder), "ours-reflinked")
        # and it resumes: the two steps after it give the uninterrupted run's losses, bit for bit
        resumed = train(block=QUARTER, steps=2, resume=True, checkpoint_dir=os.path.join(folder, "ckpt"),
                        nvme_path=os.path.join(folder, "nvme-resumed"), optimizer_offload_device="nvme", **HASHED)
        assert resumed.loss_bits == run.loss_bits[1:]
        assert resumed.result["weights_sha256"] == run.result["weights_sha256"] is not None


def test_at_two_ranks_each_rank_shares_its_own_masters(train, tmp_path, reflink_folder):
    """Two ranks (forked as the launcher starts them), parameters and optimizer on NVMe in one folder of an XFS
    image, saved after 1 of 2 steps: each rank's ZeRO file shares its own masters' blocks (no collective is added: a
    rank's masters are in its own swap files), and the checkpoint consolidates to stock's with both offloads on CPU
    at 2 ranks (stock NVMe crashes there with parameters on NVMe) bit for bit."""
    two = dict(HASHED, launcher="ranks", num_ranks=2)
    stock_folder = str(tmp_path / "ckpt-stock-2-ranks")
    stock = train(block=None, steps=2, save_after=1, checkpoint_dir=stock_folder, offload_device="cpu", **two)
    with folder_on(reflink_folder, "zero-to-fp32-2-ranks") as folder:
        run = train(block=QUARTER, steps=2, save_after=1, checkpoint_dir=os.path.join(folder, "ckpt"),
                    nvme_path=os.path.join(folder, "nvme"), offload_device="nvme", **two)
        assert run.loss_bits == stock.loss_bits
        assert run.result["weights_sha256"] == stock.result["weights_sha256"] is not None
        shared = zero_files_saved(run)
        assert sorted(shared) == [f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)], shared
        for cloned, copied, written in shared.values():  # each rank's half of gpt2-tiny's masters; the small
            assert cloned > 5_000_000 and copied + written < 100_000, shared  # tensors written
        assert_bit_for_bit(consolidate(os.path.join(folder, "ckpt")), consolidate(stock_folder), "2 ranks reflinked")


def test_stocks_checkpoint_with_the_optimizer_on_nvme_cannot_be_consolidated(train, tmp_path):
    """What the masters in the ZeRO file fix: if stock's consolidates one day, checkpoint_save.py can go."""
    folder = str(tmp_path / "ckpt-stock-nvme")
    train(block=None, steps=2, save_after=1, checkpoint_dir=folder, optimizer_offload_device="nvme", **FAST)
    assert isinstance(consolidate(folder), ValueError)


def test_a_save_one_rank_cannot_make_is_refused_on_every_rank_before_any_file_is_written(train, tmp_path):
    """A checkpoint engine that writes after its save returns (queued_checkpoint.py: DeepSpeed's decoupled writer's
    way) is given copies of the masters. At 2 ranks rank 1 shares them through a /dev/shm of 16 MiB (torch's
    "file_system" strategy), where its ranks' copies (its half of gpt2-tiny's 61 MB of masters, once a rank) do not
    fit; rank 0 shares by descriptor. Every rank stops at the save's start, rank 1 naming /dev/shm, and the
    checkpoint folder holds no file. Before, rank 1 decided alone, after its model file was queued, and rank 0 went
    on into the save's barrier (helper-144's review)."""
    if not unshare_mounts():
        pytest.skip("this machine does not let a run mount a /dev/shm of its own (unshare --mount)")
    folder = tmp_path / "ckpt"
    stopped = train(block=QUARTER, steps=2, save_after=1, checkpoint_dir=str(folder), offload_device="nvme",
                    launcher="ranks", num_ranks=2, expect_failure=True, script=QUEUED, timeout=120,
                    shm_size="160m", env={"TENCACHE_TEST_FILE_SYSTEM_SHARING_RANK": "1"}, **FAST)
    assert "which torch's \"file_system\" sharing strategy" in stopped.output, stopped.output[-3000:]
    assert "another rank refused the save (its error says why); nothing was written" in stopped.output
    assert [name for _root, _dirs, names in os.walk(folder) for name in names] == []
