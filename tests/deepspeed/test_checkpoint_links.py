"""A checkpoint saved under tencache with the optimizer on NVMe links the swap files instead of copying them, and
training after the save does not change it: after two more steps (evictions rewrite every swap file), its swap files
are byte for byte stock's, whose save copied them (integrations/deepspeed/checkpoint_save.py, io/shared_files.py).
Across file systems the files are written instead, the held ones from the host tier. Real engine, real files."""
import filecmp
import os
import shutil
import subprocess

import pytest

from test_residency import FAST  # fp32 (why: there); tests/deepspeed is on sys.path (rootdir-relative imports)

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]  # about 25 s a training run

QUARTER = {"host_cache_bytes": 70_000_000}  # evictions: swap files are rewritten during the steps after the save
SAVED = dict(steps=4, save_after=2, sub_group_size=2e6, **FAST)  # 6 sub-groups: 18 swap files in the checkpoint
SHM = "/dev/shm"
ROOM_WARNING = "training on writes them again"  # io/shared_files.room_to_write_again


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
        assert ROOM_WARNING not in run.output  # room to spare here
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


@pytest.fixture
def small_file_system(tmp_path):
    """A small ext4 file system (a 420 MiB image on a loop device, 384 MiB free: root and mkfs.ext4), else the test is
    skipped."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("needs root and mkfs.ext4 for a small file system on a loop device")
    image, mount_point = str(tmp_path / "ext4.img"), str(tmp_path / "mnt")
    os.makedirs(mount_point)
    with open(image, "wb") as handle:
        handle.truncate(420 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", image], capture_output=True, text=True)
    mounted = made.returncode == 0 and subprocess.run(["mount", "-o", "loop", image, mount_point],
                                                      capture_output=True, text=True)
    if not mounted or mounted.returncode != 0:
        pytest.skip(f"could not mount an ext4 image: {(made.stderr if made.returncode else mounted.stderr).strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", mount_point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mount_point], capture_output=True)


def test_a_save_sharing_more_than_the_room_left_says_so_and_the_step_that_finds_none_names_the_folder(
        train, small_file_system):
    """gpt2-2.7b on this machine (2026-12-06): its save linked 31 GB of swap files into the checkpoint with 11 GB
    free, and the next step's new files could not fit. The save says so as it links (a warning naming the folder and
    both sizes); the step then stops with tencache's error naming the folder, not an OSError. gpt2-tiny's 173.5 MiB
    of optimizer swap files shared, 67 MiB left on a 384 MiB file system."""
    nvme, checkpoint = os.path.join(small_file_system, "nvme"), os.path.join(small_file_system, "ckpt")
    run = train(block={"host_cache_bytes": 0}, nvme_path=nvme, checkpoint_dir=checkpoint, steps=3, save_after=1,
                seq_len=32, micro_batch=1, expect_failure=True, **FAST)
    swap_folder = os.path.join(nvme, "zero_stage_3", "optimizer", "rank0")
    [warning] = [line for line in run.output.splitlines() if ROOM_WARNING in line]
    assert f"the checkpoint shares 173.50 MiB of swap files with {swap_folder}" in warning, warning
    assert "save 3 swap files (3 linked, 0 bytes written)" in saved_line(run)
    assert f"TencacheResourceError: no space left on {swap_folder}" in run.output, run.output[-3000:]
