"""Hugging Face's Trainer with a DeepSpeed config (hf_trainer_run.py): 2 ranks, parameters and optimizer on NVMe under
tencache, an lr scheduler with warm-up, gradient accumulation, evaluations between steps, a checkpoint after step 3, the
model saved whole at the end. The run gives the losses, evaluation losses, learning rates and saved weights of stock CPU
offload run in a process that never imported tencache_ds, bit for bit; and so does the same run resumed from its
checkpoint (the first resumed update ran at learning rate 0 before tencache restored the optimizer groups' settings,
which stock's NVMe load skips). Real engine, real files; the resume through the launcher, the two runs before it forked
as the launcher starts them (tests/deepspeed/forkserver.py)."""
import os

import pytest

from conftest import launch_ranks, launch_two_ranks

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]  # three runs of 2 ranks, one through the launcher
SCRIPT = os.path.join(os.path.dirname(__file__), "hf_trainer_run.py")
pytest.importorskip("transformers")  # the bench extra, which scripts/setup.sh installs


def test_the_trainer_and_its_resume_give_stock_cpu_offloads_bits(tmp_path):
    reference = launch_ranks(SCRIPT, ["stock", "cpu", tmp_path / "stock"], 2, cleanup=[tmp_path / "stock"], forked=True,
                             stock=True)
    assert not reference["tencache"] and len(reference["history"]) == 9  # 6 losses, 3 evaluations
    ours = tmp_path / "tencache"
    uninterrupted = launch_ranks(SCRIPT, ["tencache", "nvme", ours], 2, forked=True)
    resumed = launch_two_ranks(SCRIPT, ["tencache", "nvme", ours, "resume"], cleanup=[ours])
    assert (uninterrupted["first_step"], resumed["first_step"]) == (0, 3)  # the second run resumed
    for run in (uninterrupted, resumed):
        assert run["swapping"] == 1
        assert run["history"] == reference["history"]
        assert run["weights"] == reference["weights"]
