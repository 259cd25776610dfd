"""`tencache-ds estimate --machine this`: this machine's figures, measured. Owns: the probes (NVMe bandwidth
through tencache's own O_DIRECT engine at the request size and concurrency it issues, CPU Adam throughput, host
memory bandwidth, compute throughput from a short timed forward/backward of one layer) and turning them, with the
host's memory and cores, into a machine description (plan/machine.py). Does not own: the step model (plan/step_model/).

Like `tencache-ds doctor`, everything that imports torch or DeepSpeed runs in a child process (``_probe_main``,
run as ``python -m tencache_ds.cli.calibrate``) with a timeout, so the estimate command itself stays light and a
crash there becomes a clear error. The probes, and why each is measured the way it is:

- NVMe: io/drive_rate.py's ``measure_drive``, the measurement behind the bench's bound and `doctor`: tencache's
  ``DirectFileIO`` with one store's concurrency, tensor-sized requests, a file overwritten as the stores overwrite
  theirs, no fsync after O_DIRECT writes (the stores never flush between steps); here in 1 GiB trials, long enough
  to be the rate a step sustains, three times over. Reads, writes, and both at once: the last gives the machine's
  mixed rate (a drive that does not add the two shares them in the step model). Not DeepSpeed's aio handle (which
  `doctor`'s bandwidth line uses): its single synchronous request understates what tencache gets from the drive.
  Into arena slots, as the stores' requests are; and at the rate figures' size into torch.empty buffers too, within
  each repeat, whose rates over the figures are ``nvme_small_page_factors``: DeepSpeed's swap buffers are 4 KiB
  pages, which O_DIRECT filled at about half the rate on this VM (io/drive_rate.py).
- CPU Adam: DeepSpeed's ``DeepSpeedCPUAdam`` (what ZeRO-Offload steps with) on one fp32 tensor, timed after a
  warm-up; torch's AdamW when DeepSpeed's op cannot be built (the source says which).
- Host memory: a large copy between tensors already mapped (the optimizer step's epilogue), and writing a fresh
  allocation (each page faulted in: what stage 3's backward does every micro-batch on a host accelerator).
- Compute: the model's architecture (Hugging Face ``from_config``), forward + backward at the run's micro-batch,
  sequence and dtype, built twice: with ``probe_layers`` layers and the vocabulary cut to ``CALIBRATION_VOCAB`` (the
  layers' time), and with the same layers and the real vocabulary (the difference is the embedding, output head and
  loss). The model's step is then head + layers x (per layer), and FLOP/s = the model's FLOPs
  (plan/model_shapes.py, the same count the step model uses) / that time. Enough layers that their weights exceed
  ``COMPUTE_PROBE_WEIGHT_BYTES`` (or all of them): one layer's weights stay in the CPU's caches from step to step,
  while a whole model's stream from memory. With one layer and no head the probe ran gpt2-small's shape at
  94-108 GFLOP/s where the whole model ran at 76.5 (docs/estimate.md, prospective run 3). The figure is from the
  steps' medians, the statistic of the bench's step time: in runs 12 and 13 it brought the mean error of tencache's
  rows closer to 0 than the fastest steps' figure (4-30% higher), which the method still gives (docs/estimate.md,
  run 13).
- The accelerator, where CUDA sees one (``measure_accelerator``): its name, memory and count (one rank per GPU), the
  host-to-device rate of a page-locked copy, and the compute probe above run on it (synchronised around each step).
  DeepSpeed's CPU accelerator is then not what the run uses, so the probes of the CPU accelerator's own costs (the
  collectives over gloo, ZeRO-3's hooks on host tensors) are left out and said to be: their figures would describe
  a run nobody makes there. The child then runs DeepSpeed's CUDA accelerator (CPU Adam is the op a GPU run builds),
  and its process baseline includes a CUDA context. Not yet run on a GPU (docs/estimate.md, "This machine,
  calibrated"): the next lease's `scripts/gpu_lease.sh --parts estimate` does.
- Collectives: two processes on this machine (a gloo group, as `deepspeed --num_gpus 2` starts them on the CPU
  accelerator) run the all-gather and the reduce-scatter stage 3 calls (``all_gather_into_tensor``,
  ``reduce_scatter_tensor``) at once, on a tensor of ``COLLECTIVE_BYTES``; the rate is the bytes a rank receives
  from the other per second. At 2 ranks on this VM gloo's loops took 1.5-3.4 s of CPU a gpt2-small step.
- The drive's cost to the cores (``measure_io_contention``, host accelerator only): the compute probe's layers
  (vocabulary cut) timed alone and while tencache's engine reads beside them (``io_threads`` requests of
  ``TENSOR_REQUEST_BYTES`` in flight, as the drive probe keeps them), in turn, up to three rounds; the seconds the
  steps lose over the seconds the drive is busy within their time alone (all of it where the bytes read beside them
  would have kept it busy that long at the rate the same reads had alone, timed just before: what the step model
  charges, timeline.py) is the machine's ``io_contention``, the median of the rounds. On this VM gpt2-small's
  layers ran 1.5-2x as long beside the drive (the I/O threads, the kernel and the virtual disk take turns with the
  two cores the layers use). A whole step's layers, not a matrix product: the cost is the cores' and the memory's,
  which a lone product loads unlike a model's step (0.41-0.64 s lost per GB against the layers' 0.72-0.84, by hand).
- ZeRO-3's hooks: the same layers timed bare and inside a stage-3 engine without an optimizer (the hooks that
  fetch and release every submodule's parameters, nothing to reduce); the difference per submodule use is the
  machine's ``zero3_module_call_s``. In a DeepSpeed run gpt2-small computed at 64 GFLOP/s where the bare model ran
  at 76.5.
"""
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import TencacheConfigError

# The step model needs the rate a step's gigabytes sustain, not the bench bound's fastest short burst: on this VM's
# virtual disk 256 MiB trials wrote at up to 1.81 GB/s where 2 GiB overwrites ran at 0.96-1.30 GB/s.
NVME_TRIAL_BYTES = 1 << 30
NVME_TRIAL_DEADLINE_S = 2.0
# request sizes timed beside TENSOR_REQUEST_BYTES (machine.nvme_request_factors): a small parameter partition's and
# a large sub-group tensor's (on this VM 400-512 MiB requests moved 1.3-1.6x the bytes per second of 64 MiB ones,
# and 4 MiB ones 1.1-1.5x: not a curve, a table). The large size is cut to what NVME_PROBE_BUFFER_BYTES allows for
# the requests in flight (buffers of the request's size each).
NVME_FACTOR_REQUEST_SIZES = (4 << 20, 512 << 20)
NVME_PROBE_BUFFER_BYTES = 1 << 30
NVME_REPEATS = 3                  # a shared virtual disk's rate changes from minute to minute (0.53 to 1.66 GB/s read)
ADAM_ELEMENTS = 1 << 24           # 64 MiB of fp32 per tensor: larger than the CPU's caches, as a sub-group is
ADAM_REPEATS = 5
COMPUTE_WARMUP = 6               # oneDNN picks and JIT-compiles its bf16 kernels over the first few steps
COMPUTE_REPEATS = 8
# Seconds each model probe may take (the compute probe's two models, the hooks probe's two): at a long sequence a
# step of several layers takes seconds, so fewer rounds are run (at least 1 warm-up and 2 timed): the calibration's
# child must finish within PROBE_TIMEOUT_S, NVMe and CPU Adam included.
MODEL_PROBE_BUDGET_S = 75.0
# Each probe but the compute and contention ones reports the fastest of its repeats: what the hardware does when
# nothing else runs (on a shared machine a median mixes in the other jobs; docs/estimate.md says which machine state
# each figure had). The compute probe's figure is its steps' medians: compute is the largest part of a step in the
# step model, and the bench measures a median step; the contention probe's, its rounds' median (a ratio of two
# timings, each of which the machine's minute moves).
COPY_BYTES = 256 << 20
H2D_REPEATS = 5
CALIBRATION_VOCAB = 1024
COMPUTE_PROBE_WEIGHT_BYTES = 256 << 20  # several times any CPU's last-level cache: the weights come from memory
# the drive at three request sizes (up to ~90 s on a slow disk), two 75 s model probes, the collectives (at most 60
# s), the layers beside the drive (about 40 s; its rounds 30 s at most past the first)
PROBE_TIMEOUT_S = 480.0
PROBE_MARKER = "TENCACHE_CALIBRATE "
NOT_ON_A_GPU = "{what}: not probed where CUDA sees a GPU"
NCCL_BASELINE_TIMEOUT_S = 60  # the one-rank communicator of a GPU process's baseline (_gpu_process_baseline)


# The collectives' probe: a whole tensor of this size, each rank holding its share (gpt2-small's layers gather 28 MB,
# its gradients reduce in one 0.5 GB bucket; on this VM 16 to 256 MiB moved within 15% of each other), at this many
# ranks, the fastest of the repeats after one warm-up; the processes must be done within the timeout.
COLLECTIVE_BYTES = 64 << 20
COLLECTIVE_RANKS = 2
COLLECTIVE_REPEATS = 3
COLLECTIVE_TIMEOUT_S = 60.0  # about 5 s here, most of it two interpreters importing torch


# The contention probe: rounds of the layers alone and with the drive busy, in turn; each timing at least this long
# (several steps), the median of the rounds' ratios
IO_CONTENTION_ROUNDS = 3
IO_CONTENTION_TIMING_S = 2.0
IO_CONTENTION_BUDGET_S = 30.0  # the rounds' time at most, past one round (a long sequence's step takes seconds)
IO_CONTENTION_FILE_REQUESTS = 4  # the file read over and over: 4 requests of TENSOR_REQUEST_BYTES (O_DIRECT: no cache)
# Under the drive's test hook (io/drive_rate.py QUICK_ENV) the probe of the drive beside the layers is shortened too:
# one round of timings this long (the calibration's test checks the figure is measured and cited, not its value)
IO_CONTENTION_QUICK_TIMING_S = 0.5


ALL_PROBES = ("nvme", "adam", "host_copy", "collectives", "compute", "zero3_calls", "io_contention")
# what the progress lines call each figure the child reports (calibrate's ``progress``)
FIGURE_NAMES = {"baseline_rss_bytes": "the process baseline", "nvme": "the drive", "adam": "CPU Adam",
                "host_copy": "host copies", "collectives": "the collectives", "compute": "the model's layers",
                "io_contention": "the layers beside the drive", "zero3_calls": "ZeRO-3's hooks"}
READER_JOIN_S = 5.0  # how long the child's output is awaited once it has ended
BASELINE_IMPORTS = "torch, transformers, DeepSpeed"  # the process baseline's imports, besides _import_model_code's
# the figures that are the model's and shape's, not only the machine's
MODEL_PROBES = ("compute", "zero3_calls", "io_contention")


def calibrate(nvme_path: str, model_config: Dict[str, Any], micro_batch: int, seq_len: int, dtype: str,
              timeout_s: float = PROBE_TIMEOUT_S, probes: Sequence[str] = ALL_PROBES,
              ds_config: Optional[Dict[str, Any]] = None,
              progress: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """Run the probes in a child process; returns {"nvme": {...}, "adam": {...}, "host_copy": {...},
    "collectives": {...}, "compute": {...}, "zero3_calls": {...}, "io_contention": {...}, "accelerator": {...} or
    None (the GPUs CUDA sees), "baseline_rss_bytes": int, "seconds": float}, or only the ``probes`` named
    (``MODEL_PROBES`` are the model's and shape's: another model on the same machine needs only those again).
    ``ds_config``: the run's DeepSpeed config; its aio.intra_op_parallelism sets the requests the drive probe keeps
    in flight, as the stores will. ``progress``: called with a line as each probe's figures arrive (the whole
    calibration takes minutes, and `estimate` printed nothing until it ended). Raises TencacheConfigError when the
    probe fails (the message holds its last output)."""
    from ..io.drive_rate import store_thread_counts
    request = {"nvme_path": nvme_path, "model_config": model_config, "micro_batch": micro_batch,
               "seq_len": seq_len, "dtype": dtype, "probes": list(probes),
               "io_threads": store_thread_counts(ds_config)[0]}
    started = time.perf_counter()
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    # Where CUDA sees no GPU the probes describe DeepSpeed's CPU accelerator, which DeepSpeed then picks anyway;
    # where it sees one, the child sets the CUDA accelerator before importing DeepSpeed (_probe_main), so that CPU
    # Adam is the op a GPU run builds. The hooks probe gets a world of its own, whatever launcher started `estimate`.
    env["DS_ACCELERATOR"] = "cpu"
    for key in [key for key in env if key.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))]:
        del env[key]
    # port 0: the kernel chooses the rendezvous store's port as it binds it (a launcher's own port is its ranks')
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="0")
    env.pop("LOCAL_SIZE", None)  # DeepSpeed's shared-memory all-reduce makes /dev/shm buffers when it is set
    child = subprocess.Popen([sys.executable, "-m", "tencache_ds.cli.calibrate", json.dumps(request)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=env)
    found: Dict[str, Any] = {}
    output: Dict[str, List[str]] = {"stdout": [], "stderr": []}

    def read_stdout() -> None:
        """Every line, to the end, whatever a line holds: a reader that stopped early would leave the child blocked
        on a full pipe, and the calibration would end as a timeout minutes later."""
        report = progress
        for line in child.stdout:
            output["stdout"].append(line)
            if not line.startswith(PROBE_MARKER):
                continue
            try:
                figures = json.loads(line[len(PROBE_MARKER):])
                if not isinstance(figures, dict):
                    raise ValueError(f"a {type(figures).__name__}, not an object")
            except ValueError as err:  # the calibration's failure, below
                found.setdefault("error", f"unreadable probe output ({err}): {line.strip()[:200]}")
                continue
            found.update(figures)
            said = _progress_line(figures, time.perf_counter() - started)
            if report is not None and said:
                try:
                    report(said)
                except (OSError, ValueError):  # a line that cannot be written (a closed stderr or file) ends the
                    report = None              # progress lines, not the calibration

    readers = [threading.Thread(target=read_stdout, daemon=True),
               threading.Thread(target=lambda: output["stderr"].extend(child.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    def stop_child() -> None:
        """Kill the probe and remove the drive files it leaves (up to 2 GiB)."""
        child.kill()
        child.wait()
        from ..io.drive_rate import remove_stale_trial_files
        with contextlib.suppress(OSError):
            remove_stale_trial_files(nvme_path)

    try:
        child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_child()
        raise TencacheConfigError(f"calibration of this machine took more than {timeout_s:.0f} s; pass a machine "
                                  f"file instead of --machine this") from None
    finally:
        if child.poll() is None:  # interrupted (Ctrl-C): the probe and its files do not outlive its caller
            stop_child()
        for reader in readers:  # (bounded: a process the probe started could still hold a pipe open)
            reader.join(timeout=READER_JOIN_S)
    still_open = any(reader.is_alive() for reader in readers)
    if not still_open:
        child.stdout.close()
        child.stderr.close()
    if child.returncode != 0 or "error" in found or not set(probes) <= set(found):
        tail = (found.get("error") or ("".join(output["stderr"]) or "".join(output["stdout"])).strip()[-800:])
        if still_open:
            tail += (f" (the probe's output was still open {READER_JOIN_S:.0f} s after it ended: a process it started "
                     f"holds it)")
        raise TencacheConfigError(f"calibration of this machine failed (nvme path {nvme_path}): {tail}")
    found["seconds"] = time.perf_counter() - started
    return found


def _progress_line(figures: Dict[str, Any], seconds: float) -> str:
    """What a progress line says of the figures one line of the probe reported ("" where it names none):
    measured, skipped (a figure a GPU machine does not probe) or failed (an optional figure)."""
    said = []
    for key, value in figures.items():
        name = FIGURE_NAMES.get(key)
        if name is None:
            continue
        if isinstance(value, dict) and "error" in value:
            said.append(f"{name} failed")
        elif isinstance(value, dict) and "skipped" in value:
            said.append(f"{name} skipped")
        else:
            said.append(f"measured {name}")
    return f"{', '.join(said)} ({seconds:.0f} s)" if said else ""


def model_probe_figures(measured: Dict[str, Any], default: Any = None) -> Dict[str, Any]:
    """The Machine fields that ``MODEL_PROBES`` measure, from a calibrate() result: the compute rate, ZeRO-3's cost
    per submodule call and the drive's cost to the cores (a probe left out or skipped keeps ``default``'s figure,
    a Machine's, else 0)."""
    zero3, contention = measured.get("zero3_calls", {}), measured.get("io_contention", {})
    return {"accelerator_flops_per_s": measured["compute"]["flops_per_s"],
            "zero3_module_call_s": zero3.get("call_s", getattr(default, "zero3_module_call_s", 0.0)),
            "io_contention": contention.get("io_contention", getattr(default, "io_contention", 0.0))}


def machine_from_calibration(measured: Dict[str, Any]):
    """This machine as plan/machine.py describes it: the probes' figures, the host memory and cgroup limit
    (probes/host_memory.py), DeepSpeed's CPU accelerator when no GPU is visible. Each figure's source says how it
    was measured."""
    from ..probes.host_memory import read_host_memory
    from ..plan.machine import Machine
    memory = read_host_memory()
    nvme, adam, copy, compute = measured["nvme"], measured["adam"], measured["host_copy"], measured["compute"]
    collectives = measured.get("collectives", {})
    gpu = measured.get("accelerator")  # None: DeepSpeed's CPU accelerator
    where = f"measured by `tencache-ds estimate --machine this` (cli/calibrate.py) at {time.strftime('%Y-%m-%d %H:%M')}"
    not_measured = collectives.get("skipped") or collectives.get("error")  # left out on a GPU, or failed
    collectives_source = f"not measured: {not_measured}" if not_measured else \
        f"{where}: {collectives['method']}" if collectives else "not measured"
    zero3 = measured.get("zero3_calls", {})
    contention = measured.get("io_contention", {})
    load = _load_average()
    name = (f"this machine ({os.cpu_count()} cores, {gpu['count']}x {gpu['name']})" if gpu else
            f"this machine ({os.cpu_count()} cores, no GPU: DeepSpeed's CPU accelerator)")
    accelerator_sources = {
        "accelerator_memory_bytes": f"{where}: {gpu['method']}",
        "h2d_bytes_per_s": f"{where}: {gpu['h2d_method']}",
        "ranks_per_node": f"{where}: one rank per GPU CUDA sees",
    } if gpu else {}
    return Machine(
        name=name,
        accelerator_memory_bytes=gpu["memory_bytes"] if gpu else 0,
        **model_probe_figures(measured),
        h2d_bytes_per_s=gpu["h2d_bytes_per_s"] if gpu else 1e12,
        ranks_per_node=gpu["count"] if gpu else 1,
        host_memory_bytes=memory.total_bytes, host_available_bytes=memory.available_bytes,
        nvme_read_bytes_per_s_per_drive=nvme["read_bytes_per_s"],
        nvme_write_bytes_per_s_per_drive=nvme["write_bytes_per_s"], drives=1,
        nvme_mixed_bytes_per_s_per_drive=nvme.get("mixed_bytes_per_s"),
        nvme_request_factors=tuple(map(tuple, nvme["request_factors"])) if nvme.get("request_factors") else None,
        nvme_small_page_factors=tuple(nvme["small_page_factors"]) if nvme.get("small_page_factors") else None,
        cpu_adam_elements_per_s=adam["elements_per_s"], host_copy_bytes_per_s=copy["bytes_per_s"],
        host_fresh_write_bytes_per_s=copy.get("fresh_write_bytes_per_s"),
        allgather_bytes_per_s=collectives.get("allgather_bytes_per_s"),
        reduce_scatter_bytes_per_s=collectives.get("reduce_scatter_bytes_per_s"),
        process_baseline_bytes=int(measured.get("baseline_rss_bytes") or 0) or Machine.process_baseline_bytes,
        accelerator_is_host=not gpu,
        sources={
            **accelerator_sources,
            "accelerator_flops_per_s": f"{where}: {compute['method']}",
            "nvme_read_bytes_per_s_per_drive": f"{where}: {nvme['method']}",
            "nvme_write_bytes_per_s_per_drive": f"{where}: same run, writes",
            "nvme_mixed_bytes_per_s_per_drive": f"{where}: same run, reads and writes at once, both counted",
            "nvme_request_factors": f"{where}: same run, the fastest trial at each request size over the fastest at "
                                    f"the rate figures' size",
            "nvme_small_page_factors": f"{where}: same run, the fastest trials into torch.empty buffers at the rate "
                                       f"figures' size over the fastest into arena slots"
            if nvme.get("small_page_factors") else "not measured",
            "cpu_adam_elements_per_s": f"{where}: {adam['method']}",
            "host_copy_bytes_per_s": f"{where}: {copy['method']}",
            "host_fresh_write_bytes_per_s": f"{where}: {copy['fresh_method']}" if "fresh_method" in copy
            else "not measured",
            "zero3_module_call_s": _optional_source(zero3, where),
            "io_contention": _optional_source(contention, where),
            "allgather_bytes_per_s": collectives_source,
            "reduce_scatter_bytes_per_s": f"{where}: same run, the reduce-scatter" if "method" in collectives
            else collectives_source,
            "host_memory_bytes": f"{where}: /proc/meminfo and the memory cgroup (probes/host_memory.py, bound by "
                                 f"{memory.bound_by})",
            "process_baseline_bytes": f"{where}: resident memory after importing "
                                      f"{measured.get('baseline_imports') or BASELINE_IMPORTS}",
            "load": f"1-minute load average {load} on {os.cpu_count()} cores when measured",
        })


def _optional_source(found: Dict[str, Any], where: str) -> str:
    """The source of a figure whose probe may be left out (its "skipped" says why) or not asked for."""
    if "skipped" in found:
        return f"not measured: {found['skipped']}"
    return f"{where}: {found['method']}" if found else "not measured"


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


# ------------------------------------------------------------------------------------------- the child process
def _emit(**facts: Any) -> None:
    print(PROBE_MARKER + json.dumps(facts), flush=True)


def _probe_main(argv: Sequence[str]) -> None:
    request = json.loads(argv[0])
    try:
        import torch
        on_gpu = torch.cuda.is_available()
        if on_gpu:  # before DeepSpeed reads it at import (calibrate() set the CPU accelerator)
            os.environ["DS_ACCELERATOR"] = "cuda"
            torch.zeros(1, device="cuda")  # a GPU training process has its CUDA context before any model state
        import transformers  # noqa: F401  (the baseline is a training process's: torch, transformers, DeepSpeed)
        try:
            import deepspeed  # noqa: F401
        except Exception:  # pylint: disable=broad-except
            pass
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        imported = _import_model_code(request["model_config"])
        if on_gpu:
            baseline, held = _gpu_process_baseline(torch, request["dtype"])
            _emit(baseline_rss_bytes=baseline, baseline_imports=f"{imported} and {held}")
        else:
            _emit(baseline_rss_bytes=_rss_bytes(), baseline_imports=imported)
        probes = request.get("probes", ALL_PROBES)
        # after the baseline: its page-locked buffer is not the process's
        gpu = measure_accelerator(torch) if on_gpu else None
        _emit(accelerator=gpu)
        if "nvme" in probes:
            _emit(nvme=measure_nvme(request["nvme_path"], request["io_threads"]))
        if "adam" in probes:
            _emit(adam=measure_cpu_adam(torch))
        if "host_copy" in probes:
            _emit(host_copy=measure_host_copy(torch))
        if "collectives" in probes and gpu:
            _emit(collectives={"skipped": NOT_ON_A_GPU.format(what="stage 3's collectives (NCCL there; this probe "
                                                                   "times gloo between host processes)")})
        elif "collectives" in probes:  # optional figures: a failure leaves them out, said in their source
            try:
                _emit(collectives=measure_collectives(request["dtype"]))
            except Exception as err:  # pylint: disable=broad-except
                _emit(collectives={"error": f"{type(err).__name__}: {err}"})
        if "compute" in probes:
            _emit(compute=measure_compute(torch, request["model_config"], request["micro_batch"],
                                          request["seq_len"], request["dtype"], device="cuda" if gpu else "cpu"))
        if "io_contention" in probes:
            _emit(io_contention={"skipped": NOT_ON_A_GPU.format(what="the drive's cost to the cores that compute (a "
                                                                     "GPU computes apart from them)")}
                  if gpu else measure_io_contention(torch, request["model_config"], request["micro_batch"],
                                                    request["seq_len"], request["dtype"], request["nvme_path"],
                                                    request["io_threads"]))
        if "zero3_calls" in probes and gpu:  # an optional figure there: a failure leaves it at 0, said in its source
            try:
                _emit(zero3_calls=measure_zero3_calls(torch, request["model_config"], request["micro_batch"],
                                                      request["seq_len"], request["dtype"], device="cuda"))
            except Exception as err:  # pylint: disable=broad-except
                _emit(zero3_calls={"skipped": f"ZeRO-3's hooks on the GPU: the probe failed ({type(err).__name__}: "
                                              f"{err})"})
        elif "zero3_calls" in probes:
            _emit(zero3_calls=measure_zero3_calls(torch, request["model_config"], request["micro_batch"],
                                                  request["seq_len"], request["dtype"]))
    except Exception as err:  # reported to the parent, which names the probe's inputs
        _emit(error=f"{type(err).__name__}: {err}")


def _import_model_code(model_config: Dict[str, Any]) -> str:
    """Import what a training process has imported before it builds its model, beyond ``BASELINE_IMPORTS``:
    torch._dynamo (DeepSpeed's engine imports it) and the model's modeling module (transformers imports it on the
    first from_config). 0.14 GiB on this machine with gpt2's; the baseline was short of them until 2026-11-30.
    Returns what the baseline includes, for its source. (scripts/train.py's ``preimport_model_code`` imports the
    same, for another reason; it does not import tencache_ds, which a run of untouched stock must not.)"""
    imported, step = BASELINE_IMPORTS, "torch._dynamo"
    try:
        import torch._dynamo  # noqa: F401
        imported, step = imported + ", torch._dynamo", "the model's modeling module"
        import transformers
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
        config = transformers.AutoConfig.for_model(**model_config)
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]  # the lazy mapping imports the module
        imported += f" and {model_class.__module__}"
    except Exception as err:  # pylint: disable=broad-except  (the compute probe names a model transformers lacks)
        imported += f" ({step} not imported: {type(err).__name__}: {err})"
    return imported


def _gpu_process_baseline(torch, dtype: str) -> Tuple[Optional[int], str]:
    """The resident memory of a GPU training process before any model state, and what it holds: beyond the imports
    and its CUDA context, the math libraries its first matmul and that matmul's backward load, and NCCL's
    communicator (stage 3's collectives and barriers create it, at one rank too). The first GPU runs put that
    floor 0.98 GiB above a baseline of the imports and a CUDA context alone (docs/estimate.md, "On a GPU"). The
    description gives the process's resident memory after each part; a part that failed says so and the rest
    stand; the process group is taken down after the reading."""
    import datetime
    import tempfile
    import torch.distributed as torch_dist

    def gib() -> str:  # the whole process's, after the part named beside it
        rss = _rss_bytes()
        return f"the process at {rss / 2**30:.2f} GiB" if rss is not None else "the process's size unknown"

    held = [f"a CUDA context ({gib()})"]
    try:
        weight = torch.ones(64, 64, device="cuda", dtype=_torch_dtype(torch, dtype), requires_grad=True)
        (weight @ weight).float().sum().backward()
        torch.cuda.synchronize()
        held.append(f"a matmul's forward and backward ({gib()})")
    except Exception as err:  # pylint: disable=broad-except  (the baseline stands without it, said so)
        held.append(f"no matmul ({type(err).__name__}: {err})")
    with tempfile.TemporaryDirectory(prefix="tencache-nccl-") as folder:
        try:
            # a bound on the broadcast: NCCL's watchdog ends a collective that hangs within it (its default error
            # handling may end this process: the calibration then fails in a minute, not after PROBE_TIMEOUT_S)
            torch_dist.init_process_group("nccl", init_method="file://" + os.path.join(folder, "store"), rank=0,
                                          world_size=1, timeout=datetime.timedelta(seconds=NCCL_BASELINE_TIMEOUT_S))
            torch_dist.broadcast(torch.ones(1, device="cuda"), 0)
            torch.cuda.synchronize()
            held.append(f"NCCL's communicator at one rank ({gib()})")
        except Exception as err:  # pylint: disable=broad-except
            held.append(f"no NCCL communicator ({type(err).__name__}: {err})")
        baseline = _rss_bytes()
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()
    return baseline, ", ".join(held)


def _rss_bytes() -> Optional[int]:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def measure_nvme(folder: str, io_threads: int) -> Dict[str, Any]:
    """The drive under ``folder`` as the stores use it (io/drive_rate.py: tencache's engine, ``io_threads`` requests
    in flight as one store keeps them, a file overwritten as they overwrite theirs), in trials of
    ``NVME_TRIAL_BYTES``: the rates at tensor-sized requests (``TENSOR_REQUEST_BYTES``), and relative to them the
    rates at ``NVME_FACTOR_REQUEST_SIZES``, the sizes timed in turn within each repeat (a drive that drifts from
    minute to minute drifts for all of them alike)."""
    from ..io.drive_rate import TENSOR_REQUEST_BYTES, TORCH_BUFFERS, measure_drive, repeats_made
    largest = NVME_PROBE_BUFFER_BYTES // io_threads
    sizes = tuple(sorted({TENSOR_REQUEST_BYTES, *(min(size, largest) for size in NVME_FACTOR_REQUEST_SIZES)}))
    rate = measure_drive(folder, request_sizes=sizes, thread_counts=(io_threads,), trial_bytes=NVME_TRIAL_BYTES,
                         deadline_s=NVME_TRIAL_DEADLINE_S, repeats=NVME_REPEATS,
                         torch_buffer_sizes=(TENSOR_REQUEST_BYTES,))
    by_size = {size: rate.at_request_size(size) for size in sizes}  # OSError: a size that timed no bytes
    reference = by_size[TENSOR_REQUEST_BYTES]
    small_pages = rate.at_request_size(TENSOR_REQUEST_BYTES, TORCH_BUFFERS)

    def mixed(each) -> float:
        return each.both_read_bytes_per_s + each.both_write_bytes_per_s

    return {"method": f"{rate.method}; trials of {NVME_TRIAL_BYTES >> 20} MiB, the fastest of "
                      f"{repeats_made(NVME_REPEATS)}; "
                      f"the rates at {TENSOR_REQUEST_BYTES >> 20} MiB requests, the others relative to them",
            "path": folder, "read_bytes_per_s": reference.read_bytes_per_s,
            "write_bytes_per_s": reference.write_bytes_per_s,
            "mixed_bytes_per_s": mixed(reference),
            "request_factors": [[size, each.read_bytes_per_s / reference.read_bytes_per_s,
                                 each.write_bytes_per_s / reference.write_bytes_per_s]
                                for size, each in by_size.items()],
            "small_page_factors": [small_pages.read_bytes_per_s / reference.read_bytes_per_s,
                                   small_pages.write_bytes_per_s / reference.write_bytes_per_s,
                                   mixed(small_pages) / mixed(reference)]}


def measure_accelerator(torch, nbytes: int = COPY_BYTES) -> Optional[Dict[str, Any]]:
    """The GPUs CUDA sees (None where it sees none): the first one's name and total memory (a machine file's
    figure, as the datasheets give it), their count (one rank each), and the rate of a host-to-device copy from
    page-locked memory (what DeepSpeed's swap buffers and tencache's registered slots are), synchronised, the
    fastest of ``H2D_REPEATS``."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    source = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    target.copy_(source, non_blocking=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(H2D_REPEATS):
        started = time.perf_counter()
        target.copy_(source, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    count = torch.cuda.device_count()
    return {"name": props.name, "memory_bytes": int(props.total_memory), "count": count,
            "method": f"torch.cuda.get_device_properties(0): {props.name}, {props.total_memory / 2**30:.1f} GiB; "
                      f"{count} GPU(s) visible",
            "h2d_bytes_per_s": nbytes / min(times),
            "h2d_method": f"a {nbytes >> 20} MiB copy from page-locked host memory to GPU 0, synchronised, fastest "
                          f"of {H2D_REPEATS}"}


def measure_cpu_adam(torch, elements: int = ADAM_ELEMENTS) -> Dict[str, Any]:
    """Elements per second of one Adam step on fp32 master, gradient and moments in host memory."""
    param = torch.nn.Parameter(torch.randn(elements))
    param.grad = torch.randn(elements)
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        optimizer, method = DeepSpeedCPUAdam([param], lr=1e-4), "DeepSpeedCPUAdam"
    except Exception as err:  # no compiler, no op: the plain torch optimizer is what would run
        optimizer, method = torch.optim.AdamW([param], lr=1e-4), f"torch AdamW (DeepSpeedCPUAdam: {err})"
    optimizer.step()  # allocates the moments, builds nothing later
    times = []
    for _ in range(ADAM_REPEATS):
        started = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - started)
    seconds = min(times)
    return {"method": f"{method}, {elements} fp32 elements, fastest of {ADAM_REPEATS} steps, "
                      f"{torch.get_num_threads()} threads",
            "elements_per_s": elements / seconds, "step_s": seconds}


def measure_host_copy(torch, nbytes: int = COPY_BYTES) -> Dict[str, Any]:
    """Bytes per second (read + written) of a large fp32 copy: the bandwidth of the optimizer step's memory-bound
    epilogue (gradient copies, clipping, the cast back to fp16); and bytes per second written into a fresh
    allocation (``fresh_write_bytes_per_s``: every page faulted in first, as stage 3's backward writes its gradients
    and buckets on a host accelerator)."""
    source = torch.randn(nbytes // 4)
    target = torch.empty_like(source)
    target.copy_(source)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - started)
    seconds = min(times)
    fresh_s = []
    for _ in range(5):  # a new allocation this large is mapped fresh and unmapped when freed: every page faults
        started = time.perf_counter()
        torch.empty(nbytes // 4).fill_(1.0)
        fresh_s.append(time.perf_counter() - started)
    return {"method": f"torch copy of {nbytes >> 20} MiB fp32, fastest of 5, {torch.get_num_threads()} threads",
            "bytes_per_s": 2 * nbytes / seconds,
            "fresh_method": f"torch.empty({nbytes >> 20} MiB fp32).fill_: memory written at its first touch (page "
                            f"faults), fastest of 5, {torch.get_num_threads()} threads",
            "fresh_write_bytes_per_s": nbytes / min(fresh_s)}


def measure_collectives(dtype: str = "fp32", ranks: int = COLLECTIVE_RANKS,
                        nbytes: int = COLLECTIVE_BYTES) -> Dict[str, Any]:
    """Bytes a rank receives per second from the others in stage 3's all-gather and reduce-scatter, in ``dtype``,
    ``ranks`` processes of this machine running each at once (plan/machine.py, ``allgather_bytes_per_s``,
    ``reduce_scatter_bytes_per_s``). Raises RuntimeError with the failed rank's error or exit code, or naming the
    ranks that had not reported within ``COLLECTIVE_TIMEOUT_S``; a rank still running at the end is killed."""
    import multiprocessing
    import multiprocessing.connection
    import tempfile
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no process group, no forked threads
    # a file store, not a TCP port: a port found free here could be taken before rank 0 binds it
    with tempfile.TemporaryDirectory(prefix="tencache-collectives-") as folder:
        address = "file://" + os.path.join(folder, "store")
        pipes = [context.Pipe(duplex=False) for _ in range(ranks)]  # (the parent's end, the rank's end)
        workers = [context.Process(target=_collective_rank, args=(rank, ranks, address, nbytes, dtype, sending),
                                   daemon=True) for rank, (_receiving, sending) in enumerate(pipes)]
        for worker, (_receiving, sending) in zip(workers, pipes):
            worker.start()
            sending.close()  # the rank's end lives in the rank: its exit closes it, and recv() then says so
        reports: Dict[int, Dict[str, Any]] = {}
        deadline = time.monotonic() + COLLECTIVE_TIMEOUT_S
        # until every rank reported (a rank may linger in gloo's shutdown after it did), one failed (the others would
        # wait for it in the collective), or time is up
        while len(reports) < ranks and not any("error" in report for report in reports.values()) and \
                time.monotonic() < deadline:
            waiting = [receiving for rank, (receiving, _sending) in enumerate(pipes) if rank not in reports]
            for receiving in multiprocessing.connection.wait(waiting, timeout=max(0.0, deadline - time.monotonic())):
                rank = next(rank for rank, (mine, _sending) in enumerate(pipes) if mine is receiving)
                try:
                    reports[rank] = receiving.recv()
                except EOFError:  # it exited without a word: killed, or crashed below Python
                    workers[rank].join(1.0)
                    reports[rank] = {"error": f"rank {rank} exited with code {workers[rank].exitcode} before it "
                                              f"reported"}
        for worker in workers:
            if worker.is_alive():
                worker.kill()
            worker.join()
        for receiving, _sending in pipes:
            receiving.close()
    errors = [report["error"] for report in reports.values() if "error" in report]
    if errors or len(reports) != ranks:
        missing = [rank for rank in range(ranks) if rank not in reports]
        raise RuntimeError(f"the collectives probe failed: {'; '.join(errors) or 'no error reported'}"
                           + (f"; rank(s) {missing} had not reported within {COLLECTIVE_TIMEOUT_S:.0f} s"
                              if missing and not errors else ""))
    slowest = {kind: max(report[kind] for report in reports.values()) for kind in ("allgather_s", "reduce_scatter_s")}
    element = _element_bytes(dtype)
    received = nbytes // element // ranks * element * (ranks - 1)
    return {"method": f"{ranks} processes, gloo, all_gather_into_tensor and reduce_scatter_tensor of a "
                      f"{nbytes >> 20} MiB {dtype} tensor at once, the bytes a rank receives; the slowest rank's "
                      f"fastest of {COLLECTIVE_REPEATS} after one",
            "allgather_bytes_per_s": received / slowest["allgather_s"],
            "reduce_scatter_bytes_per_s": received / slowest["reduce_scatter_s"], **slowest}


def _collective_rank(rank: int, ranks: int, address: str, nbytes: int, dtype: str, report) -> None:
    """One rank of the collectives probe: sends {"allgather_s", "reduce_scatter_s"} (its fastest of
    ``COLLECTIVE_REPEATS`` after a warm-up) or {"error"} on the connection ``report``."""
    try:
        import datetime
        import warnings
        import torch
        import torch.distributed as torch_dist
        # torch 2.13 calls stage 3's two collectives deprecated (DeepSpeed 0.19.8 still calls them): said once per
        # call, into the calibration's output
        warnings.simplefilter("ignore", FutureWarning)
        # a rank left alone (its peer died) gives up with the probe, not after gloo's default 30 minutes
        torch_dist.init_process_group("gloo", init_method=address, rank=rank, world_size=ranks,
                                      timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        try:
            element = _element_bytes(dtype)
            # ones: every value stays a small normal number however often it is summed (no NaN, no denormals)
            whole = torch.ones(nbytes // element // ranks * ranks, dtype=_torch_dtype(torch, dtype))
            share = torch.ones(whole.numel() // ranks, dtype=whole.dtype)
            times = {"allgather_s": [], "reduce_scatter_s": []}
            for repeat in range(COLLECTIVE_REPEATS + 1):
                for kind in times:
                    torch_dist.barrier()
                    started = time.perf_counter()
                    if kind == "allgather_s":
                        torch_dist.all_gather_into_tensor(whole, share)
                    else:
                        torch_dist.reduce_scatter_tensor(share, whole)
                    if repeat:  # the first round is the warm-up
                        times[kind].append(time.perf_counter() - started)
            report.send({kind: min(seconds) for kind, seconds in times.items()})
        finally:
            torch_dist.destroy_process_group()
    except Exception as err:  # pylint: disable=broad-except  (reported by the parent, with the rank)
        report.send({"error": f"rank {rank}: {type(err).__name__}: {err}"})


def _element_bytes(dtype: str) -> int:
    return {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]


def probe_layers(model_config: Dict[str, Any], element_bytes: int) -> int:
    """How many layers the compute probe builds: enough that their weights exceed ``COMPUTE_PROBE_WEIGHT_BYTES``,
    at most the model's."""
    from ..plan.model_shapes import model_shape
    shape = model_shape(model_config)
    layer_bytes = element_bytes * sum(numel for module in shape.modules if module.layer == 0
                                      for _name, numel in module.params)
    return max(1, min(shape.layers, -(-COMPUTE_PROBE_WEIGHT_BYTES // max(layer_bytes, 1))))


def _probe_model(torch, model_config: Dict[str, Any], layers: int, vocab_size: int, dtype: str):
    """The architecture with ``layers`` layers and ``vocab_size`` tokens, in ``dtype``."""
    import transformers
    from ..plan.model_shapes import layer_count_key
    config = dict(model_config)
    config[layer_count_key(model_config)] = layers
    config["vocab_size"] = vocab_size
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    return model.to(_torch_dtype(torch, dtype))


def _training_step(torch, model, vocab_size: int, micro_batch: int, seq_len: int, device: str = "cpu"):
    """One forward + backward of ``model`` on fixed random tokens, on ``device`` (on a GPU it returns when the GPU
    is done: the timer around it times the GPU's work)."""
    tokens = torch.randint(0, vocab_size, (micro_batch, seq_len), device=device)

    def one_step():
        model(input_ids=tokens, labels=tokens).loss.backward()
        for parameter in model.parameters():
            parameter.grad = None
        if device != "cpu":
            torch.cuda.synchronize()

    return one_step


def _forward_step(torch, model, vocab_size: int, micro_batch: int, seq_len: int, device: str = "cpu"):
    """One forward of ``model`` (a module, or a DeepSpeed engine that calls it) on fixed random tokens on ``device``,
    its graph dropped (on a GPU it returns when the GPU is done)."""
    tokens = torch.randint(0, vocab_size, (micro_batch, seq_len), device=device)

    def one_step():
        model(input_ids=tokens, labels=tokens)
        if device != "cpu":
            torch.cuda.synchronize()

    return one_step


def _timed_steps(steps: Dict[str, Any], budget_s: float = MODEL_PROBE_BUDGET_S) -> Dict[str, Any]:
    """Each step timed, interleaved (a machine whose speed drifts slows all of them alike): ``COMPUTE_REPEATS``
    runs after ``COMPUTE_WARMUP``, or as many as ``budget_s`` allows after the first round (at least 1 warm-up and
    2 timed). Gives each step's fastest run (name -> seconds; the hooks probe's statistic), its median ("median":
    name -> seconds; the compute probe's) and how many ran ("warmup", "repeats")."""
    started = time.perf_counter()
    for one_step in steps.values():  # the first warm-up round: kernels chosen and compiled, buffers allocated
        one_step()
    rounds = max(3, int(budget_s / max(time.perf_counter() - started, 1e-6)))
    warmup = max(1, min(COMPUTE_WARMUP, rounds // 3))
    repeats = max(2, min(COMPUTE_REPEATS, rounds - warmup))
    for _ in range(warmup - 1):
        for one_step in steps.values():
            one_step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, one_step in steps.items():
            started = time.perf_counter()
            one_step()
            times[name].append(time.perf_counter() - started)
    return dict({name: min(seconds) for name, seconds in times.items()}, warmup=warmup, repeats=repeats,
                median={name: statistics.median(seconds) for name, seconds in times.items()})


def measure_compute(torch, model_config: Dict[str, Any], micro_batch: int, seq_len: int,
                    dtype: str, device: str = "cpu") -> Dict[str, Any]:
    """FLOP/s of the whole model's forward + backward at the run's shape and dtype, on ``device`` ("cpu", or
    "cuda" where the run's accelerator is a GPU), from the architecture built with ``probe_layers`` layers, without
    and with the real vocabulary (the module docstring says why)."""
    from ..plan.model_shapes import model_shape
    shape = model_shape(model_config)
    layers = probe_layers(model_config, torch.finfo(_torch_dtype(torch, dtype)).bits // 8)
    vocab = int(model_config.get("vocab_size", CALIBRATION_VOCAB))
    cut = min(vocab, CALIBRATION_VOCAB)

    def step(vocab_size):
        model = _probe_model(torch, model_config, layers, vocab_size, dtype).to(device)
        return _training_step(torch, model, vocab_size, micro_batch, seq_len, device)

    steps = {"layers": step(cut)}
    if vocab > cut:
        steps["with_head"] = step(vocab)
    timed = _timed_steps(steps)

    def model_step_s(times):  # head + layers x (per layer), from one statistic of the probe's steps
        head = max(0.0, times["with_head"] - times["layers"]) if "with_head" in times else 0.0
        return head, times["layers"] / layers, head + shape.layers * times["layers"] / layers

    # The figure is the steps' medians, as the bench's step time is a median (validation runs 12 and 13)
    head_s, layer_s, seconds = model_step_s(timed["median"])
    fastest_s = model_step_s(timed)[2]
    flops = shape.train_flops(micro_batch * seq_len, seq_len, checkpointing=False)
    ran_on = f"{torch.get_num_threads()} threads" if device == "cpu" else f"on {device}, synchronised"
    return {"method": f"{model_config.get('model_type')} with {layers} of its {shape.layers} layers, forward + "
                      f"backward, with vocabulary {cut} and {vocab} (the head: {head_s * 1e3:.1f} ms), micro-batch "
                      f"{micro_batch} x {seq_len} tokens, {dtype}, median of {timed['repeats']} steps after "
                      f"{timed['warmup']}, interleaved, {ran_on}; the model's step = head + {shape.layers} x "
                      f"{layer_s * 1e3:.1f} ms a layer (from the fastest steps: {fastest_s:.3f} s, "
                      f"{flops / fastest_s / 1e9:.1f} GFLOP/s)",
            "flops": flops, "step_s": seconds, "flops_per_s": flops / seconds, "layer_s": layer_s,
            "fastest_step_s": fastest_s, "fastest_flops_per_s": flops / fastest_s,
            "head_s": head_s, "probe_layers": layers}


def measure_io_contention(torch, model_config: Dict[str, Any], micro_batch: int, seq_len: int, dtype: str,
                          folder: str, io_threads: int) -> Dict[str, Any]:
    """The seconds the compute probe's layers lose per second the drive is busy beside them (plan/machine.py,
    ``io_contention``; the module docstring says how). The drive's busy seconds within the layers' time alone are
    what the step model charges (timeline.py): all of it where the reads beside them would have kept the drive busy
    that long at the rate they had alone (timed here too, just before the rounds), else that share."""
    import threading
    from ..io.direct_io import DirectFileIO
    from ..io.drive_rate import ARENA_BUFFERS, QUICK_ENV, TENSOR_REQUEST_BYTES, quick_drive, trial_buffers, trial_file
    quick = quick_drive()
    timing_s, most_rounds = (IO_CONTENTION_QUICK_TIMING_S, 1) if quick else (IO_CONTENTION_TIMING_S,
                                                                             IO_CONTENTION_ROUNDS)
    layers = probe_layers(model_config, torch.finfo(_torch_dtype(torch, dtype)).bits // 8)
    vocab = min(int(model_config.get("vocab_size", CALIBRATION_VOCAB)), CALIBRATION_VOCAB)
    one_step = _training_step(torch, _probe_model(torch, model_config, layers, vocab, dtype), vocab, micro_batch,
                              seq_len)
    os.makedirs(folder, exist_ok=True)
    path = trial_file(folder, "contention")
    requests = IO_CONTENTION_FILE_REQUESTS

    def keep_reading(done: Callable[[], bool], moved: list, failed: list) -> None:
        """Reads of the file in turn, ``io_threads`` in flight, until ``done()``; ``moved[0]`` counts the bytes of
        each as it completes, ``failed`` gets the error that stopped them."""
        pending, index = [], 0
        try:
            while not done():
                pending.append(io.read(buffers[index % io_threads], path, TENSOR_REQUEST_BYTES,
                                       (index % requests) * TENSOR_REQUEST_BYTES))
                index += 1
                if len(pending) >= io_threads:
                    pending.pop(0).result()
                    moved[0] += TENSOR_REQUEST_BYTES
            for future in pending:
                future.result()
                moved[0] += TENSOR_REQUEST_BYTES
        except Exception as err:  # pylint: disable=broad-except  (re-raised by the timing that started the reads)
            failed.append(err)

    def timed(steps: int, with_drive: bool):
        """``steps`` of the layers, alone or with the drive reading beside them: (seconds, bytes read meanwhile)."""
        stop, moved, failed = threading.Event(), [0], []
        reader = threading.Thread(target=keep_reading, args=(stop.is_set, moved, failed), daemon=True) \
            if with_drive else None
        try:
            if reader:
                reader.start()
            started, before = time.perf_counter(), moved[0]
            for _ in range(steps):
                one_step()
            seconds, read = time.perf_counter() - started, moved[0] - before
        finally:
            stop.set()
            if reader:
                reader.join()
        if failed:
            raise failed[0]
        return seconds, read

    def remove_file() -> None:
        with contextlib.suppress(OSError):
            os.remove(path)

    with contextlib.ExitStack() as stack:  # on leaving: the engine closed, then the buffers, then the file removed
        stack.callback(remove_file)
        # the stores' kind of buffer: the drive's busy seconds for the bytes, which the model charges, are theirs
        buffers = stack.enter_context(trial_buffers(ARENA_BUFFERS, TENSOR_REQUEST_BYTES, io_threads))
        io = DirectFileIO(num_threads=io_threads, name="tencache-contention")
        stack.callback(io.close)
        for index in range(requests):
            buffers[0].fill_(index + 1)
            io.write(buffers[0], path, TENSOR_REQUEST_BYTES, index * TENSOR_REQUEST_BYTES).result()
        alignment = io.alignment_for(path)
        one_step()  # warm-up: kernels chosen, buffers allocated
        started = time.perf_counter()
        one_step()
        step_s = time.perf_counter() - started
        steps = max(1, int(timing_s / max(step_s, 1e-6)) + 1)
        # at least one round; fewer than IO_CONTENTION_ROUNDS where a step takes seconds (each round is 2 x steps)
        rounds = max(1, min(most_rounds, int(IO_CONTENTION_BUDGET_S / (2 * steps * step_s))))
        started, alone_moved, failed = time.perf_counter(), [0], []
        keep_reading(lambda: alone_moved[0] >= 4 * requests * TENSOR_REQUEST_BYTES, alone_moved, failed)
        if failed:
            raise failed[0]
        read_rate = alone_moved[0] / (time.perf_counter() - started)
        ratios, details = [], []
        for round_index in range(rounds):
            # alone first in even rounds, beside first in odd ones: a drift of the machine's speed cancels out
            order = (False, True) if round_index % 2 == 0 else (True, False)
            timings = {with_drive: timed(steps, with_drive) for with_drive in order}
            (alone, _), (beside, read) = timings[False], timings[True]
            busy_s = min(alone, read / read_rate)  # the drive's busy seconds within the layers' own time
            ratios.append(max(0.0, beside - alone) / busy_s if busy_s > 0 else 0.0)
            details.append(f"{alone:.2f} s alone, {beside:.2f} s beside {read / 1e9:.2f} GB")
    contention = statistics.median(ratios)
    return {"method": f"{layers} layers of {model_config.get('model_type')} (vocabulary {vocab}), {steps} forward + "
                      f"backward steps alone and while tencache's engine read {TENSOR_REQUEST_BYTES >> 20} MiB "
                      f"requests into arena slots beside them, {io_threads} in flight, O_DIRECT alignment "
                      f"{alignment} B (0: buffered) "
                      f"({read_rate / 1e9:.2f} GB/s alone), in turn, {rounds} round{'s' * (rounds != 1)} "
                      f"({'; '.join(details)}): the "
                      f"seconds lost over the drive's busy seconds within the steps' time alone, the median of the "
                      f"rounds" + (f" (shortened by {QUICK_ENV})" if quick else ""),
            "io_contention": contention, "rounds": ratios, "read_bytes_per_s": read_rate}


def measure_zero3_calls(torch, model_config: Dict[str, Any], micro_batch: int, seq_len: int,
                        dtype: str, device: str = "cpu") -> Dict[str, Any]:
    """Seconds ZeRO-3's hooks add to each use of a submodule that owns parameters (plan/machine.py,
    ``zero3_module_call_s``): the compute probe's layers (vocabulary cut), their forward timed bare and inside a
    stage-3 engine without an optimizer (DeepSpeed's ZeRO-Offload: the fetch and release hooks on every submodule,
    every parameter partitioned), interleaved; the difference over the forward's submodule uses. The backward's
    hooks (a fetch before each submodule's backward, a release after) are taken to cost the same: such an engine
    refuses a backward (it has no optimizer to take the gradients), and one with an optimizer adds stage 3's
    gradient reduction, which the step model prices apart. On a GPU (``device`` "cuda", DeepSpeed's CUDA accelerator)
    both forwards run there, synchronised: what the hooks add beside the GPU's work at this shape (the first GPU run
    spent 0.06-0.09 s a step of gpt2-small in stage 3's fetches, where the model had 9 ms of copies: docs/estimate.md,
    "On a GPU")."""
    import deepspeed
    os.environ.setdefault("MASTER_PORT", "0")  # a world of one (calibrate() sets it, and the rest, for its child)
    deepspeed.init_distributed(verbose=False)
    layers = probe_layers(model_config, torch.finfo(_torch_dtype(torch, dtype)).bits // 8)
    vocab = min(int(model_config.get("vocab_size", CALIBRATION_VOCAB)), CALIBRATION_VOCAB)
    torch.manual_seed(0)
    bare = _probe_model(torch, model_config, layers, vocab, dtype).to(device)
    engine, *_ = deepspeed.initialize(model=_probe_model(torch, model_config, layers, vocab, dtype), config={
        "train_micro_batch_size_per_gpu": micro_batch,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "bf16": {"enabled": dtype == "bf16"}})
    fastest = _timed_steps({"bare": _forward_step(torch, bare, vocab, micro_batch, seq_len, device),
                            "zero3": _forward_step(torch, engine, vocab, micro_batch, seq_len, device)})
    uses = len(_probe_shape(model_config, layers, vocab).modules)
    extra_s = max(0.0, fastest["zero3"] - fastest["bare"])
    return {"method": f"{layers} layers of {model_config.get('model_type')} (vocabulary {vocab}), forward bare "
                      f"({fastest['bare'] * 1e3:.1f} ms) and under a ZeRO-3 engine without optimizer, every "
                      f"parameter partitioned ({fastest['zero3'] * 1e3:.1f} ms), over its {uses} submodule uses "
                      f"(a backward's taken to cost the same), fastest of {fastest['repeats']} after "
                      f"{fastest['warmup']}, interleaved" + ("" if device == "cpu" else f", on {device}, synchronised"),
            "bare_s": fastest["bare"], "zero3_s": fastest["zero3"], "uses": uses, "call_s": extra_s / uses}


def _probe_shape(model_config: Dict[str, Any], layers: int, vocab_size: int):
    from ..plan.model_shapes import layer_count_key, model_shape
    return model_shape(dict(model_config, **{layer_count_key(model_config): layers, "vocab_size": vocab_size}),
                       "probe")


def _torch_dtype(torch, dtype: str):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]


if __name__ == "__main__":
    _probe_main(sys.argv[1:])
