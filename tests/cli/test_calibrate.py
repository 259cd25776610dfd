"""`--machine this`'s collectives probe (cli/calibrate.py, ``measure_collectives``): two processes of this machine in
a gloo group, as `deepspeed --num_gpus 2` starts them on the CPU accelerator. The whole calibration runs in
tests/cli/test_estimate.py (slow); this part alone takes a few seconds."""
import pytest

from tencache_ds.cli.calibrate import measure_collectives


def test_two_processes_time_stage3s_all_gather_and_reduce_scatter():
    measured = measure_collectives("fp32", nbytes=4 << 20)
    assert measured["allgather_bytes_per_s"] > 0 and measured["reduce_scatter_bytes_per_s"] > 0
    # the rate is the bytes a rank receives: half the tensor at 2 ranks, over the slowest rank's time
    assert measured["allgather_bytes_per_s"] == (2 << 20) / measured["allgather_s"]
    assert "2 processes, gloo" in measured["method"] and "4 MiB fp32" in measured["method"]


def test_the_process_baseline_is_measured_after_a_training_process_s_imports(tmp_path):
    """A training process has imported torch._dynamo and the model's modeling module before it builds its model:
    0.14 GiB on this machine with gpt2's, which the baseline lacked until 2026-11-30 (docs/estimate.md)."""
    import json
    import os
    from tencache_ds.cli.calibrate import calibrate
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "configs", "models", "gpt2-tiny.json")) as handle:
        model_config = json.load(handle)
    measured = calibrate(str(tmp_path), model_config, 1, 32, "fp32", probes=())
    assert measured["baseline_rss_bytes"] > 0
    assert measured["baseline_imports"] == ("torch, transformers, DeepSpeed, torch._dynamo and "
                                            "transformers.models.gpt2.modeling_gpt2")


def test_the_compute_probe_reports_its_steps_median_beside_the_fastest(monkeypatch):
    """Validation runs recompute their predictions with either statistic (docs/estimate.md, run 12): the probe's
    timed steps, interleaved, give each step's fastest and median time."""
    from tencache_ds.cli import calibrate
    clock = iter(range(0, 10_000))  # perf_counter: 0, 1, 2, ... a call
    durations = {"a": iter([5, 1, 4, 2, 3, 9] * 4), "b": iter([7] * 24)}
    now = [0.0]

    def step(name):
        return lambda: now.__setitem__(0, now[0] + next(durations[name]))

    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: now[0] + 1e-9 * next(clock))
    timed = calibrate._fastest({"a": step("a"), "b": step("b")}, budget_s=1e9)
    assert timed["warmup"] == calibrate.COMPUTE_WARMUP and timed["repeats"] == calibrate.COMPUTE_REPEATS
    # after 6 warm-up calls of "a" (5 1 4 2 3 9), 8 timed ones: 5 1 4 2 3 9 5 1
    assert timed["a"] == pytest.approx(1) and timed["median"]["a"] == pytest.approx(3.5)  # of 1 1 2 3 4 5 5 9
    assert timed["b"] == pytest.approx(7) and timed["median"]["b"] == pytest.approx(7)
