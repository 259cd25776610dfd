"""scripts/gpu_check.sh, the first run on a lent GPU machine: its dry run checks the environment and prints the
plan anywhere (and passes on a machine without CUDA); a real run refuses to start without a CUDA device."""
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "gpu_check.sh")


def run(*args, out):
    return subprocess.run(["bash", SCRIPT, *args, "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_dry_run_checks_the_environment_and_prints_every_run(tmp_path):
    result = run("--dry-run", out=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== environment" in result.stdout and "a CUDA device" in result.stdout
    runs = [line for line in result.stdout.splitlines() if "scripts/train.py --deepspeed_config" in line]
    # stock and three budgets (streaming, 25%, auto) at gradient accumulation 1 and 4
    assert len(runs) == 8
    assert sum("--grad-accum 4" in line for line in runs) == 4
    assert sum("--tencache-block 'none'" in line for line in runs) == 2
    assert "bench" in result.stdout and "gpu_check.md" in result.stdout
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
    # --no-bench: the same runs, no bench
    without_bench = run("--dry-run", "--no-bench", out=tmp_path)
    assert without_bench.returncode == 0, without_bench.stdout + without_bench.stderr
    assert [line for line in without_bench.stdout.splitlines() if "scripts/train.py --deepspeed_config" in line] == runs
    assert "cli.main bench" in result.stdout and "cli.main bench" not in without_bench.stdout


def test_a_real_run_without_cuda_stops_before_running_anything(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: a real run would start")
    result = run(out=tmp_path / "out")
    assert result.returncode == 1
    assert "nothing was run" in result.stderr
    assert not (tmp_path / "out").exists()
