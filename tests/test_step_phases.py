"""scripts/step_phases.py, the per-phase host timer the GPU leases run (docs/gpu_check.md): under the deepspeed
launcher, as the leases run it, on the CPU accelerator. It must drop the warm-up steps, time each phase with the
training thread's CPU time beside it, time every tencache method with STEP_PHASES_DETAIL=1, and give each thread's CPU
time; a lease has no second chance to find that a key is missing. The run also shows what the fifth lease found on
the GPU (docs/gpu_check.md): at one rank, with every partition held, DeepSpeed gathers the parameters in buckets,
with the losses and fp32 weights of stock CPU offload run in a process that never imported tencache_ds."""
import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.deepspeed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


GAS = 2  # a step is an optimizer step: engine.step() is called every micro-batch and updates at the last
TRAIN = ["scripts/train.py", "--deepspeed_config", "configs/stock-nvme-defaults.json", "--model", "gpt2-tiny",
         "--steps", "4", "--micro-batch", "1", "--grad-accum", str(GAS), "--seq-len", "8", "--dtype", "fp32",
         "--weights-gather", "grouped"]
LAUNCHER = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "1"]


def free_port():
    """A port nothing listens on now: the launcher's default, 29500, is another suite's too (helper-227)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(args, env=None, launcher=LAUNCHER):
    if launcher is LAUNCHER:
        launcher = LAUNCHER + ["--master_port", str(free_port())]
    run = subprocess.run(launcher + args, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO, **(env or {})),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def test_phases_under_the_launcher_with_every_tencache_method_and_thread(tmp_path):
    out = tmp_path / "phases.json"
    run = launch(["scripts/step_phases.py", "tencache", str(out), "--"] + TRAIN
                 + ["--nvme-path", str(tmp_path / "nvme"), "--tencache-block",
                    '{"enabled": true, "device_cache_bytes": 0}', "--result-file", str(tmp_path / "result.json")],
                 env={"STEP_PHASES_DETAIL": "1"})
    report = json.loads(out.read_text())
    assert report["steps"] == 2 and not report["synchronized"]  # 4 steps, the first 2 dropped
    phases = report["phases"]
    for name in ("DeepSpeedEngine.forward", "DeepSpeedEngine.backward", "DeepSpeedEngine.step",
                 "PartitionedParameterCoordinator.fetch_sub_module", "TencacheCoordinator.fetch_sub_module",
                 "TencacheOptimizerSwapper.swap_in_optimizer_state", "HostTierGovernor.before_forward",
                 "EntryStore.lend"):
        assert name in phases, sorted(phases)
    step = phases["DeepSpeedEngine.step"]
    assert step["calls_per_step"] == GAS and 0 < step["cpu_ms_per_step"] <= step["ms_per_step"] * 1.05
    assert phases["DeepSpeedZeroOptimizer_Stage3.step"]["calls_per_step"] == 1  # one update a step
    # the measured steps' wall time holds the three engine calls (the loop's own work is the rest)
    engine = sum(phases[f"DeepSpeedEngine.{name}"]["ms_per_step"] for name in ("forward", "backward", "step"))
    assert engine <= report["wall_ms_per_step"] * 1.01
    threads = report["thread_cpu"]
    assert threads["main"]["threads"] == 1 and threads["main"]["cpu_ms_per_step"] > 0
    assert "[phases] tencache: 2 steps" in run.stdout
    # the device tier off, so every module's parameters are gathered: the held partitions are lent to DeepSpeed's
    # NVMe prefetch without slots, and its gathers take several partitions each (7 a step for gpt2-tiny's 10 when
    # it was told a slot's worth at a time, 4 now)
    gathers = phases["PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params"]
    ours = json.loads((tmp_path / "result.json").read_text())
    partitions = ours["steps"][-1]["stats"]["param_num_tensors"]
    assert 0 < 2 * gathers["calls_per_step"] / GAS <= partitions  # a forward pass's gathers
    # each step's CPU time as train.py records it (the seventh lease told a slow machine from slow code by it)
    for step in ours["steps"]:
        cpu = step["cpu"]
        assert 0 < cpu["thread_cpu_s"] <= cpu["process_cpu_s"] and cpu["last_cpu"] >= 0, cpu
        assert cpu["voluntary_switches"] >= 0 and cpu["involuntary_switches"] >= 0, cpu
    # swapping moves bytes, never math: stock CPU offload's bits, from a process that never imported tencache_ds (a
    # plain one: the launcher's start-up is not what this compares)
    launch(TRAIN + ["--nvme-path", str(tmp_path / "stock"), "--tencache-block", "none", "--offload-device", "cpu",
                    "--untouched-stock", "--result-file", str(tmp_path / "stock.json")], launcher=[sys.executable])
    stock = json.loads((tmp_path / "stock.json").read_text())
    assert [step["loss_bits"] for step in ours["steps"]] == [step["loss_bits"] for step in stock["steps"]]
    assert ours["weights_sha256"] == stock["weights_sha256"] is not None
