"""Paths the "tencache" block names, tried as a new user would: one that cannot be written stops scripts/train.py
with an error naming the key and the path, at zero.Init, before any swap file exists (not at the first metrics
line, after the swap files; not never, for a profile that would silently not be saved).

/proc takes no new file whatever its permission bits say, so the run fails for root too (these tests run as root).

And the swap folder two runs are given at once (one nvme_path for two experiments): the second stops at its start,
naming the key and the first run, and the first trains on undisturbed (io/folder_lock.py)."""
import ctypes
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, TRAIN

pytestmark = pytest.mark.deepspeed
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@pytest.mark.parametrize("key", ["metrics_path", "profile_path"])
def test_an_unwritable_output_path_stops_the_run_before_any_swap_file(train, tmp_path, key):
    nvme = tmp_path / "nvme"
    path = os.path.join("/proc", "tencache-runs", f"{key}.json")
    failed = train(block={key: path}, nvme_path=str(nvme), expect_failure=True, steps=1, weights_gather="none")
    assert f"tencache.{key} = '{path}' is not usable" in failed.output, failed.output[-3000:]
    assert "TencacheResourceError" in failed.output
    swap_files = [name for _root, _dirs, names in os.walk(nvme) for name in names]
    assert swap_files == []


def test_a_metrics_file_that_fails_to_be_written_mid_run_is_said_and_training_goes_on(train, tmp_path):
    """Regression test (helper-218): a write of the metrics file failing mid-run (a full disk: /dev/full takes the
    open, every write fails) raised from stage 3's _post_step on rank 0 alone, after the update, before the engine
    counted the step: the run stopped there (at 2 ranks the others waited in their next collective). It is said
    once, and training goes on."""
    run = train(block={"metrics_path": "/dev/full"}, nvme_path=str(tmp_path / "nvme"), steps=2,
                weights_gather="none")
    assert "tencache.metrics_path /dev/full cannot be written" in run.output, run.output[-3000:]
    assert len(run.result["steps"]) == 2


def _killed_with_this_process():
    """A child's pre-exec hook: the kernel kills it when the test's process dies (a stopped child would otherwise
    stay stopped for ever if the test worker were killed between its SIGSTOP and SIGCONT)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def test_a_second_run_in_a_swap_folder_in_use_stops_and_the_first_trains_on(train, tmp_path):
    """Before, the second run emptied the folder under the first, which stopped at its next read ("swap file ...
    is missing") or, with other timing, one run read the other's bytes. The first run is stopped (SIGSTOP) once it
    holds both its folders (the optimizer's is taken at ``deepspeed.initialize``, after zero.Init wrote the
    parameters' swap files) and continued after the second has tried: the two overlap however fast either is, and
    every read of the first's steps comes after the second's attempt (60 bf16 steps kept them overlapping before: 6
    minutes of the suite)."""
    nvme = tmp_path / "nvme"
    lock = nvme / "zero_stage_3" / "optimizer" / "rank0.lock"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    steps = 3
    first = subprocess.Popen(
        [sys.executable, TRAIN, "--deepspeed_config", os.path.join(REPO, "configs", "stock-nvme.json"),
         "--model", "gpt2-tiny", "--dtype", "fp32", "--steps", str(steps), "--nvme-path", str(nvme),
         "--weights-gather", "none",
         "--tencache-block", '{"enabled": true, "host_cache_bytes": 0}'],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_killed_with_this_process)
    try:
        deadline = time.time() + 120
        while not (lock.exists() and f"pid {first.pid} " in lock.read_text()) and first.poll() is None:
            assert time.time() < deadline, "the first run never held its swap folders"
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)
        assert first.poll() is None, first.communicate()[0][-3000:]  # held, not ended: the second meets it
        try:
            second = train(block={"host_cache_bytes": 0}, nvme_path=str(nvme), expect_failure=True, dtype="fp32",
                           steps=1, weights_gather="none")
        finally:
            first.send_signal(signal.SIGCONT)
        output, _ = first.communicate(timeout=600)
    finally:
        first.kill()
        first.wait()
    assert "TencacheResourceError" in second.output, second.output[-3000:]
    assert (f"zero_optimization.offload_param.nvme_path = '{nvme}': its swap folder {nvme}/zero_stage_3/float32params"
            f"/rank0 is in use by another run (pid {first.pid} on ") in second.output, second.output[-3000:]
    assert first.returncode == 0, output[-3000:]
    assert len(re.findall(r"^step \d+ loss ", output, re.M)) == steps


def test_what_a_killed_run_left_hidden_in_the_swap_folder_is_removed_at_the_next_start(train, tmp_path):
    """A run killed in a checkpoint load (the checkpoint's files staged, or being adopted) or in a copy before a
    write leaves hidden files in the optimizer's swap folder, whole swap files' size each; nothing removed them,
    since the folder outlives runs (stock never empties it either). The next start removes them, and leaves other
    names alone. Since 2026-12-07 also those of a process that is alive (here the test's own): the start holds the
    folder's lock, so no other process uses the folder, and a container restarted with a fresh pid namespace gives
    live processes the killed run's ids (helper-155's review)."""
    import socket
    nvme = tmp_path / "nvme"
    folder = nvme / "zero_stage_3" / "optimizer" / "rank0"
    folder.mkdir(parents=True)
    here, gone = socket.gethostname(), 4_000_000  # above the default pid_max: no such process
    dead = [f".{kind}.{gone}@{here}@0_9.tensor.swp" for kind in ("tmp", "loading", "adopting", "narrowing")]
    dead.append(f".tmp.{os.getpid()}@{here}@a1b2c3d4.0_9.tensor.swp")  # a live process's, its id reused
    kept = ["notes.txt"]
    for name in dead + kept:
        (folder / name).write_bytes(b"\0" * 4096)
    train(block={"enabled": True}, nvme_path=str(nvme), steps=1, weights_gather="none")
    left = set(os.listdir(folder))
    assert not left & set(dead), sorted(left)
    assert set(kept) <= left, sorted(left)
