"""An nvme_path that fills up during training. Under write-back the bytes tencache owes its files reach the disk
at a checkpoint; when the disk cannot hold them, the checkpoint fails with an error naming the folder, the bytes
and the remedy, before DeepSpeed records it as the latest; nothing hangs. Real engine, a real tmpfs too small for
what write-back owes (it holds the files zero.Init writes, not the optimizer state kept in memory)."""
import pytest

from test_residency import FAST  # tests/deepspeed is on sys.path (pytest rootdir-relative imports)

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]

MiB = 1 << 20


@pytest.fixture
def small_disk(small_tmpfs):
    """A 96 MiB tmpfs: gpt2-tiny's fp32 partitions (58 MiB) fit, its optimizer state (230 MiB) does not."""
    return str(small_tmpfs("96m"))


def test_a_checkpoint_on_a_full_disk_fails_with_the_folder_and_is_not_recorded_as_the_latest(train, small_disk,
                                                                                            tmp_path):
    checkpoint = tmp_path / "ckpt"
    failed = train(block={}, nvme_path=small_disk, steps=3, save_after=2, checkpoint_dir=str(checkpoint),
                   expect_failure=True, **FAST)
    assert failed.returncode == 1, failed.output[-3000:]
    assert "step 1 loss" in failed.output  # training itself ran: write-back kept the optimizer state in memory
    assert "TencacheResourceError: no space left on " + small_disk in failed.output, failed.output[-3000:]
    assert "point zero_optimization.offload_*.nvme_path at a larger device" in failed.output
    assert not (checkpoint / "latest").exists()  # DeepSpeed never recorded the half-written checkpoint
