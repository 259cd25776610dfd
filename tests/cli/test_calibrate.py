"""`--machine this`'s probes apart (cli/calibrate.py): the collectives probe (two processes of this machine in a gloo
group, as `deepspeed --num_gpus 2` starts them on the CPU accelerator), the process baseline, the compute probe's
statistics, and the GPU branch over stand-ins for torch.cuda (no GPU here). The whole calibration runs in
tests/cli/test_estimate.py (slow); these take seconds."""
import os

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
    lines = []
    measured = calibrate(str(tmp_path), model_config, 1, 32, "fp32", probes=(), progress=lines.append)
    assert measured["baseline_rss_bytes"] > 0
    # each figure is reported as it arrives (the whole calibration takes minutes): the baseline's is the one here
    assert len(lines) == 1 and lines[0].startswith("measured the process baseline ("), lines
    # a progress line that cannot be written ends the lines, not the reading of the probe's figures after it

    def closed(_line):
        raise BrokenPipeError("stderr closed")
    measured = calibrate(str(tmp_path), model_config, 1, 32, "fp32", probes=(), progress=closed)
    assert measured["baseline_rss_bytes"] > 0 and "accelerator" in measured
    assert measured["baseline_imports"] == ("torch, transformers, DeepSpeed, torch._dynamo and "
                                            "transformers.models.gpt2.modeling_gpt2")


def test_the_compute_probe_reports_its_steps_median_beside_the_fastest(monkeypatch):
    """Validation runs recompute their predictions with either statistic (docs/estimate.md, run 12): the probe's
    timed steps, interleaved, give each step's fastest and median time."""
    from tencache_ds.cli import calibrate
    clock = iter(range(0, 10_000))  # each perf_counter call a nanosecond later: the steps' own time is what counts
    durations = {"a": iter([5, 1, 4, 2, 3, 9] * 4), "b": iter([7] * 24)}
    now = [0.0]

    def step(name):
        return lambda: now.__setitem__(0, now[0] + next(durations[name]))

    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: now[0] + 1e-9 * next(clock))
    timed = calibrate._timed_steps({"a": step("a"), "b": step("b")}, budget_s=1e9)
    assert timed["warmup"] == calibrate.COMPUTE_WARMUP and timed["repeats"] == calibrate.COMPUTE_REPEATS
    # after 6 warm-up calls of "a" (5 1 4 2 3 9), 8 timed ones: 5 1 4 2 3 9 5 1
    assert timed["a"] == pytest.approx(1) and timed["median"]["a"] == pytest.approx(3.5)  # of 1 1 2 3 4 5 5 9
    assert timed["b"] == pytest.approx(7) and timed["median"]["b"] == pytest.approx(7)


def test_the_compute_figure_is_the_steps_medians_and_the_fastest_is_given_beside_it(monkeypatch):
    """The bench's step time is a median, so the compute figure is the probe's steps' medians (docs/estimate.md,
    runs 12 and 13); the fastest steps' figure stays in the method and the result. The probe's model and steps
    are stand-ins here: only the arithmetic from the timed steps to the figure is under test."""
    import json
    import torch
    from tencache_ds.cli import calibrate
    from tencache_ds.plan.model_shapes import model_shape
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "configs", "models", "gpt2-small.json")) as handle:
        model_config = json.load(handle)

    class Model:
        def to(self, device):
            return self

    monkeypatch.setattr(calibrate, "_probe_model", lambda *args: Model())
    monkeypatch.setattr(calibrate, "_training_step", lambda *args: (lambda: None))
    monkeypatch.setattr(calibrate, "_timed_steps", lambda steps: {"layers": 1.0, "with_head": 1.5, "warmup": 6,
                                                                  "repeats": 8,
                                                                  "median": {"layers": 2.0, "with_head": 3.5}})
    measured = calibrate.measure_compute(torch, model_config, 2, 64, "fp32")
    shape, layers = model_shape(model_config), measured["probe_layers"]
    median_s, fastest_s = 1.5 + shape.layers * 2.0 / layers, 0.5 + shape.layers * 1.0 / layers
    assert measured["step_s"] == pytest.approx(median_s) and measured["head_s"] == pytest.approx(1.5)
    assert measured["flops_per_s"] == pytest.approx(measured["flops"] / median_s)
    assert measured["fastest_flops_per_s"] == pytest.approx(measured["flops"] / fastest_s)
    assert "median of 8 steps after 6" in measured["method"]
    assert f"from the fastest steps: {fastest_s:.3f} s" in measured["method"]


def _measured(accelerator):
    """What the probe child reports, with figures made up: the machine description is built from them alone."""
    from tencache_ds.cli.calibrate import NOT_ON_A_GPU
    measured = {"nvme": {"method": "engine", "read_bytes_per_s": 2e9, "write_bytes_per_s": 1e9},
                "adam": {"method": "DeepSpeedCPUAdam", "elements_per_s": 1e9},
                "host_copy": {"method": "copy", "bytes_per_s": 2e10},
                "compute": {"method": "gpt2 layers", "flops_per_s": 3e14 if accelerator else 1e11},
                "baseline_rss_bytes": 1 << 30, "accelerator": accelerator}
    if accelerator:
        measured["collectives"] = {"skipped": NOT_ON_A_GPU.format(what="stage 3's collectives")}
        measured["zero3_calls"] = {"skipped": NOT_ON_A_GPU.format(what="ZeRO-3's hooks")}
        measured["io_contention"] = {"skipped": NOT_ON_A_GPU.format(what="the drive's cost to the cores")}
    else:
        measured["zero3_calls"] = {"method": "hooks", "call_s": 1e-3}
        measured["io_contention"] = {"method": "layers beside the drive", "io_contention": 0.7}
    return measured


class _FakeCuda:
    """torch.cuda as measure_accelerator uses it, on a machine without one: 8 GPUs of 150 GB; every copy "takes"
    the seconds the fake clock advances."""

    def __init__(self, clock, copy_s):
        self.clock, self.copy_s = clock, copy_s

    def is_available(self):
        return True

    def get_device_properties(self, index):
        return type("Props", (), {"name": "NVIDIA H200", "total_memory": 150_000_000_000})()

    def device_count(self):
        return 8

    def synchronize(self):
        self.clock[0] += self.copy_s.pop(0)


class _FakeTorch:
    uint8 = "uint8"

    def __init__(self, clock, copy_s):
        self.cuda = _FakeCuda(clock, copy_s)
        self.allocated = []

    def empty(self, nbytes, dtype, pin_memory=False, device="cpu"):
        self.allocated.append((nbytes, pin_memory, device))
        return type("Tensor", (), {"copy_": lambda self, source, non_blocking=False: None})()


def test_where_cuda_sees_gpus_this_machine_is_described_with_them_not_as_a_cpu_accelerator(monkeypatch):
    """`--machine this` on a GPU box described DeepSpeed's CPU accelerator ("no GPU") until 2026-11-30: a
    prediction for a run nobody makes there. The GPU's memory, count and H2D rate come from the probe
    (``measure_accelerator``, here over a stand-in for torch.cuda: no GPU on this machine), and the CPU
    accelerator's own figures (gloo collectives, hooks on host tensors) are said to be not measured."""
    from tencache_ds.cli import calibrate
    clock = [0.0]
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: clock[0])
    # a warm-up copy, then H2D_REPEATS timed ones: the fastest moves 256 MiB in 5 ms
    fake = _FakeTorch(clock, [1.0] + [0.006, 0.005, 0.007, 0.005, 0.008][:calibrate.H2D_REPEATS])
    gpu = calibrate.measure_accelerator(fake, nbytes=256 << 20)
    assert (256 << 20, True, "cpu") in fake.allocated and (256 << 20, False, "cuda") in fake.allocated
    assert gpu["h2d_bytes_per_s"] == pytest.approx((256 << 20) / 0.005)
    machine = calibrate.machine_from_calibration(_measured(gpu))
    assert not machine.accelerator_is_host and "8x NVIDIA H200" in machine.name and "no GPU" not in machine.name
    assert (machine.accelerator_memory_bytes, machine.ranks_per_node) == (150e9, 8)
    assert machine.h2d_bytes_per_s == pytest.approx((256 << 20) / 0.005)
    assert machine.accelerator_flops_per_s == 3e14 and machine.zero3_module_call_s == 0.0
    assert machine.allgather_bytes_per_s is None
    assert machine.sources["zero3_module_call_s"].startswith("not measured: ZeRO-3's hooks: not probed where CUDA")
    assert machine.io_contention == 0.0 and machine.sources["io_contention"].startswith("not measured: the drive's")
    assert machine.sources["allgather_bytes_per_s"].startswith("not measured: stage 3's collectives")
    assert "page-locked" in machine.sources["h2d_bytes_per_s"] and "one rank per GPU" in machine.sources[
        "ranks_per_node"]

    cpu = calibrate.machine_from_calibration(_measured(None))
    assert cpu.accelerator_is_host and "no GPU" in cpu.name and cpu.ranks_per_node == 1
    assert cpu.accelerator_memory_bytes == 0 and cpu.zero3_module_call_s == 1e-3 and cpu.io_contention == 0.7
    assert "layers beside the drive" in cpu.sources["io_contention"]


def test_the_accelerator_probe_finds_none_without_cuda():
    import torch
    from tencache_ds.cli.calibrate import measure_accelerator
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: scripts/gpu_lease.sh --parts estimate runs the probe there")
    assert measure_accelerator(torch) is None


def test_where_cuda_sees_a_gpu_the_probe_child_runs_compute_there_and_leaves_the_cpu_accelerators_probes_out(
        monkeypatch, capsys):
    """The child's routing (``_probe_main``), in this process with the probes replaced by recorders and CUDA
    pretended: the CUDA accelerator set before DeepSpeed is imported and a CUDA context before the baseline, the
    compute and hooks probes on "cuda" (a hooks probe that fails there leaves its figure out, said why), the
    collectives and contention probes not run, each said to be left out."""
    import json
    import torch
    from tencache_ds.cli import calibrate
    calls = []
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # as calibrate() starts the child; restored after the test
    # DeepSpeed picks its accelerator once per process: picked here, before the child's code sets "cuda", so that
    # the later tests of this worker keep the CPU accelerator (its import in _probe_main is then a no-op)
    from deepspeed.accelerator import get_accelerator
    assert get_accelerator().device_name() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: calls.append(("cuda context", k.get("device")))
                        if k.get("device") == "cuda" else real_zeros(*a, **k))
    monkeypatch.setattr(calibrate, "measure_accelerator", lambda torch: {"name": "GPU", "count": 1})
    monkeypatch.setattr(calibrate, "_gpu_process_baseline", lambda torch, dtype: calls.append(("baseline", dtype))
                        or (123, "a CUDA context (1.00 GiB), a matmul's forward and backward (1.40 GiB)"))
    for probe in ("nvme", "cpu_adam", "host_copy"):
        monkeypatch.setattr(calibrate, f"measure_{probe}", lambda *a, probe=probe, **k: calls.append(probe) or {})
    monkeypatch.setattr(calibrate, "measure_compute", lambda *a, device="cpu": calls.append(("compute", device))
                        or {})
    for probe in ("collectives", "io_contention"):
        monkeypatch.setattr(calibrate, f"measure_{probe}", lambda *a, probe=probe, **k: pytest.fail(f"{probe} ran"))

    def zero3_calls(*args, device="cpu"):  # run on the GPU, and a failure there leaves the figure out, said why
        calls.append(("zero3_calls", device))
        raise RuntimeError("no engine here")

    monkeypatch.setattr(calibrate, "measure_zero3_calls", zero3_calls)
    request = {"nvme_path": "/nonexistent", "model_config": {"model_type": "gpt2"}, "micro_batch": 1, "seq_len": 8,
               "dtype": "fp32", "probes": list(calibrate.ALL_PROBES), "io_threads": 1}
    calibrate._probe_main([json.dumps(request)])
    found = {}
    for line in capsys.readouterr().out.splitlines():
        if line.startswith(calibrate.PROBE_MARKER):
            found.update(json.loads(line[len(calibrate.PROBE_MARKER):]))
    assert "error" not in found, found.get("error")
    assert calls[0] == ("cuda context", "cuda") and ("compute", "cuda") in calls and ("zero3_calls", "cuda") in calls
    assert {"nvme", "cpu_adam", "host_copy"} <= set(calls) and found["accelerator"] == {"name": "GPU", "count": 1}
    assert calls[1] == ("baseline", "fp32") and found["baseline_rss_bytes"] == 123
    assert found["baseline_imports"].endswith(" and a CUDA context (1.00 GiB), a matmul's forward and backward "
                                              "(1.40 GiB)")
    assert "not probed where CUDA sees a GPU" in found["collectives"]["skipped"]
    assert found["zero3_calls"] == {"skipped": "ZeRO-3's hooks on the GPU: the probe failed (RuntimeError: no engine "
                                               "here)"}
    assert "not probed where CUDA sees a GPU" in found["io_contention"]["skipped"]
    assert os.environ["DS_ACCELERATOR"] == "cuda" and get_accelerator().device_name() == "cpu"


def test_the_gpu_baseline_says_what_it_could_not_hold_and_leaves_no_process_group():
    """``_gpu_process_baseline`` on this machine, where CUDA and NCCL are missing: the matmul and the communicator
    each say why they are not in the baseline, the reading is the process's resident memory, and no process group
    is left behind (the probes after it, and this test worker, run without one)."""
    import torch
    import torch.distributed as torch_dist
    from tencache_ds.cli import calibrate
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the parts would be held")
    baseline, held = calibrate._gpu_process_baseline(torch, "bf16")
    assert baseline == pytest.approx(calibrate._rss_bytes(), rel=0.05)
    assert held.startswith("a CUDA context (the process at ") and ", no matmul (" in held
    assert ", no NCCL communicator (" in held
    assert not torch_dist.is_initialized()


def test_the_contention_probe_times_the_layers_alone_and_beside_the_drive_and_removes_its_file(tmp_path,
                                                                                                 monkeypatch):
    """The drive's cost to the cores that compute (``io_contention``): gpt2-tiny's layers timed alone and while
    tencache's engine reads beside them, in turn; the figure is the median of the rounds' seconds lost over the
    drive's busy seconds, and the probe's file is gone after it."""
    import json
    import statistics
    import torch
    from tencache_ds.cli import calibrate
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "configs", "models", "gpt2-tiny.json")) as handle:
        model_config = json.load(handle)
    monkeypatch.setattr(calibrate, "IO_CONTENTION_TIMING_S", 0.3)  # short timings: the arithmetic is under test
    measured = calibrate.measure_io_contention(torch, model_config, 1, 32, "fp32", str(tmp_path), 2)
    assert len(measured["rounds"]) == calibrate.IO_CONTENTION_ROUNDS
    # Alone this 2-core VM's layers lose 0.45-0.78 of the drive's busy seconds (docs/estimate.md, run 15); the suite
    # runs this test beside another (-n 2), which takes the cores in both timings, so only the sign is certain here.
    assert measured["io_contention"] == statistics.median(measured["rounds"]) >= 0
    assert measured["read_bytes_per_s"] > 0 and " GB; " in measured["method"] and "2 in flight" in measured["method"]
    assert "into arena slots" in measured["method"]  # the stores' buffers: the drive's busy seconds are theirs
    assert os.listdir(tmp_path) == []


def test_the_drive_is_timed_into_arena_slots_and_torch_buffers_give_stocks_factors(tmp_path, monkeypatch):
    """The machine's NVMe figures are the drive's rates into the stores' arena slots; the same repeats time
    torch.empty buffers (DeepSpeed's swap buffers) at the figures' request size, and their rates over the figures'
    are ``nvme_small_page_factors`` (read, write, mixed), which the model's stock policy moves its bytes at."""
    from tencache_ds.cli import calibrate
    from tencache_ds.io.drive_rate import QUICK_ENV
    monkeypatch.setenv(QUICK_ENV, "1")
    monkeypatch.setattr(calibrate, "NVME_PROBE_BUFFER_BYTES", 256 << 20)  # the largest request 128 MiB: seconds
    nvme = calibrate.measure_nvme(str(tmp_path / "drive"), 2)
    factors = nvme["small_page_factors"]
    assert len(factors) == 3 and all(factor > 0 for factor in factors)
    assert "into arena slots" in nvme["method"]
    measured = dict(_measured(None), nvme=nvme)
    machine = calibrate.machine_from_calibration(measured)
    assert machine.nvme_small_page_factors == pytest.approx(tuple(factors))
    assert machine.nvme_read_bytes_per_s_per_drive == nvme["read_bytes_per_s"]
    assert "torch.empty buffers" in machine.sources["nvme_small_page_factors"]
    without = calibrate.machine_from_calibration(_measured(None))  # a calibration of before 2026-12-06
    assert without.nvme_small_page_factors is None and without.sources["nvme_small_page_factors"] == "not measured"


def test_a_failed_read_stops_the_contention_probe_with_its_error_and_removes_its_file(tmp_path, monkeypatch):
    """A read that fails (a vanished drive) beside the layers, in the reader thread, ends the probe with that error,
    not with a figure from the bytes read before it; the probe's 256 MiB file goes however it stops."""
    import json
    import threading
    import torch
    from tencache_ds.cli import calibrate
    from tencache_ds.io.direct_io import DirectFileIO
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "configs", "models", "gpt2-tiny.json")) as handle:
        model_config = json.load(handle)

    real_read, calls = DirectFileIO.read, []

    def failing_read(self, *args, **kwargs):  # the rate alone takes 17 reads; the 20th is beside the layers
        calls.append(threading.current_thread().name)
        if len(calls) >= 20:
            raise OSError(5, "Input/output error (a stand-in)")
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(DirectFileIO, "read", failing_read)
    monkeypatch.setattr(calibrate, "IO_CONTENTION_TIMING_S", 0.3)
    with pytest.raises(OSError, match="a stand-in"):
        calibrate.measure_io_contention(torch, model_config, 1, 32, "fp32", str(tmp_path), 2)
    assert calls[-1] != threading.main_thread().name  # it failed in the reader beside the layers
    assert os.listdir(tmp_path) == []


def test_a_progress_line_says_what_each_figure_came_to():
    """`estimate --machine this` prints a line as each probe reports (cli/calibrate.py ``_progress_line``): a figure a
    GPU machine does not probe is said as skipped, an optional one that failed as failed, not as measured."""
    from tencache_ds.cli.calibrate import _progress_line
    assert _progress_line({"nvme": {"read_bytes_per_s": 1e9}}, 41.2) == "measured the drive (41 s)"
    assert _progress_line({"collectives": {"error": "RuntimeError: gloo"}}, 50) == "the collectives failed (50 s)"
    assert _progress_line({"io_contention": {"skipped": "not probed"}}, 60) == \
        "the layers beside the drive skipped (60 s)"
    assert _progress_line({"baseline_rss_bytes": 1, "baseline_imports": "torch"}, 3) == \
        "measured the process baseline (3 s)"
    assert _progress_line({"accelerator": None}, 3) == ""  # nothing a user asked about


def test_a_calibration_past_its_timeout_is_stopped_with_the_limit_named_and_nothing_left_running(tmp_path):
    """The probe's child is killed at the timeout (1 s here: it is still importing torch), the error names the limit
    and the way round it, and neither the child nor the threads reading its output outlive the call."""
    import json
    import threading
    from tencache_ds.cli.calibrate import calibrate
    from tencache_ds.errors import TencacheConfigError
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "configs", "models", "gpt2-tiny.json")) as handle:
        model_config = json.load(handle)
    before = set(threading.enumerate())
    with pytest.raises(TencacheConfigError, match=r"took more than 1 s; pass a machine file instead of --machine this"):
        calibrate(str(tmp_path), model_config, 1, 32, "fp32", probes=(), timeout_s=1)
    assert set(threading.enumerate()) <= before
