"""Crash and restart: a tencache run SIGKILLed right after an optimizer step (its newest optimizer state and
weights only in host memory, under write-back) leaves its last checkpoint loadable, and a restart from it gives
exactly the losses and fp32 weights of a resume after a clean exit. The killed run's swap files stay in nvme_path;
the restart runs in the same nvme_path with every one of them overwritten by garbage, so any stale byte read as
valid data would change the losses. Real engine, real files."""
import os
import signal

import pytest

from test_residency import FAST  # fp32 (why: there); tests/deepspeed is on sys.path (rootdir-relative imports)

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]

AUTO = {}
QUARTER = {"host_cache_bytes": 70_000_000}  # evictions write back during the step that is killed
GARBAGE = b"\x7f\xc0" * 2048  # about -4.0 read as bf16 or fp32: any stale byte that is used shows in the loss


def swap_files(folder):
    return sorted(os.path.join(root, name) for root, _dirs, names in os.walk(folder) for name in names
                  if name.endswith(".swp"))


def poison(paths):
    """Garbage of each file's size under each name. A new file renamed over the name, not a write in place: swap files
    not written since the last save are the checkpoint's files under a second name (hard links,
    integrations/deepspeed/checkpoint_save.py), and tencache never writes such a file in place either."""
    for path in paths:
        size = os.path.getsize(path)
        with open(path + ".garbage", "wb") as handle:
            handle.write((GARBAGE * (size // len(GARBAGE) + 1))[:size])
        os.replace(path + ".garbage", path)


def test_a_run_killed_after_an_optimizer_step_restarts_from_its_checkpoint_exactly(train, tmp_path):
    # the clean pattern: 2 steps, save, 1 more step, exit; resume for 2 steps
    clean = str(tmp_path / "ckpt-clean")
    train(block=AUTO, steps=3, save_after=2, checkpoint_dir=clean, **FAST)
    resumed_clean = train(block=AUTO, steps=2, resume=True, checkpoint_dir=clean, **FAST)

    # the same run SIGKILLed right after step 2's optimizer step (before anything is flushed)
    crashed, nvme = str(tmp_path / "ckpt-crashed"), str(tmp_path / "nvme-crashed")
    killed = train(block=QUARTER, steps=3, save_after=2, kill_after_step=2, checkpoint_dir=crashed, nvme_path=nvme,
                   expect_failure=True, **FAST)
    assert killed.returncode == -signal.SIGKILL, killed.output[-3000:]
    assert "step 2 loss" in killed.output and "killing this process" in killed.output
    stale = swap_files(nvme)
    assert stale, "the killed run left no swap files behind: the test would prove nothing"
    poison(stale)

    restarted = train(block=QUARTER, steps=2, resume=True, checkpoint_dir=crashed, nvme_path=nvme, **FAST)
    assert restarted.last_stats["tencache_enabled"] == 1
    assert restarted.loss_bits == resumed_clean.loss_bits
    assert restarted.result["weights_sha256"] == resumed_clean.result["weights_sha256"]
