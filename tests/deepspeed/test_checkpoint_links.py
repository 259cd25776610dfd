"""A checkpoint saved under tencache with the optimizer on NVMe links the swap files instead of copying them, and
training after the save does not change it: after two more steps (evictions rewrite every swap file), its swap files
are byte for byte stock's, whose save copied them (integrations/deepspeed/checkpoint_save.py, io/shared_files.py).
Across file systems the files are written instead, the held ones from the host tier. Real engine, real files."""
import filecmp
import os

import pytest

from test_residency import FAST  # fp32 (why: there); tests/deepspeed is on sys.path (rootdir-relative imports)

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]  # about 25 s a training run

QUARTER = {"host_cache_bytes": 70_000_000}  # evictions: swap files are rewritten during the steps after the save
SAVED = dict(steps=4, save_after=2, sub_group_size=2e6, **FAST)  # 6 sub-groups: 18 swap files in the checkpoint
SHM = "/dev/shm"


def swap_files(checkpoint):
    folder = os.path.join(checkpoint, "ckpt", "offloaded_tensors", "rank00")
    return folder, sorted(os.listdir(folder))


def saved_line(run):
    [line] = [line for line in run.output.splitlines() if "[tencache] save" in line and "swap files" in line]
    return line


def assert_same_swap_files(stock_checkpoint, checkpoint):
    stock_folder, names = swap_files(stock_checkpoint)
    folder, ours = swap_files(checkpoint)
    assert ours == names and len(names) == 18
    _match, mismatch, errors = filecmp.cmpfiles(stock_folder, folder, names, shallow=False)
    assert (mismatch, errors) == ([], [])


def test_a_linked_checkpoint_is_stocks_bytes_after_training_on(train, tmp_path):
    stock = str(tmp_path / "ckpt-stock")
    train(block=None, checkpoint_dir=stock, **SAVED)
    ours, nvme = str(tmp_path / "ckpt-ours"), str(tmp_path / "nvme-ours")
    run = train(block=QUARTER, checkpoint_dir=ours, nvme_path=nvme, **SAVED)
    try:
        assert "save 18 swap files (18 linked, 0 bytes written)" in saved_line(run)
        assert_same_swap_files(stock, ours)
        folder, names = swap_files(ours)
        swap_folder = os.path.join(nvme, "zero_stage_3", "optimizer", "rank0")
        left = [name for name in names if os.path.exists(os.path.join(swap_folder, name))]
        rewritten = [name for name in left if not os.path.samefile(os.path.join(folder, name),
                                                                   os.path.join(swap_folder, name))]
        assert rewritten, "no swap file was written after the save: the test proves nothing"
        # the run ended without engine.destroy() (as scripts/train.py does): the names it still shared with the
        # checkpoint left the swap folder at exit, where a later stock run would have written into them in place
        assert len(left) < len(names), "every swap file was rewritten after the save: the exit removed nothing"
        assert [name for name in os.listdir(swap_folder)
                if os.stat(os.path.join(swap_folder, name)).st_nlink > 1] == []
    finally:
        import shutil
        shutil.rmtree(nvme, ignore_errors=True)


@pytest.mark.skipif(not os.path.isdir(SHM), reason="needs /dev/shm")
def test_across_file_systems_the_checkpoint_is_written(train, tmp_path):
    if os.stat(SHM).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the same file system as the swap folder")
    stock = str(tmp_path / "ckpt-stock")
    train(block=None, checkpoint_dir=stock, **SAVED)
    ours = os.path.join(SHM, f"tencache-test-ckpt-{os.getpid()}")
    try:
        run = train(block=QUARTER, checkpoint_dir=ours, **SAVED)
        assert "save 18 swap files (0 linked," in saved_line(run)
        assert_same_swap_files(stock, ours)
        resumed = train(block=QUARTER, steps=2, resume=True, checkpoint_dir=ours, sub_group_size=2e6, **FAST)
        assert resumed.loss_bits == run.loss_bits[2:]
    finally:
        import shutil
        shutil.rmtree(ours, ignore_errors=True)
