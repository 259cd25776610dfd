"""`tencache-ds bench`: train one model under stock ZeRO-Infinity and under tencache_ds and compare them.
Owns: the run plan (interleaved repeats), the child command lines, their logs and progress, holding --nvme-path
for the whole bench (a second bench there stops before it runs: both would use the same run folders), and writing
the outputs. Does not own: training (scripts/train.py, run as a child process through the `deepspeed` launcher or plain
python) or the comparison itself (tencache_ds/bench/report.py).

Both arms get the same DeepSpeed config file; the stock run passes ``--tencache-block none`` and the tencache run a
block built from the config's own "tencache" block (if any) and --host-cache-bytes/--device-cache-bytes. Each run
has its own swap subfolder under --nvme-path (emptied before and removed after it) and its own files in --out:

    <out>/<label>.log  <out>/<label>.result.json  <out>/<label>.metrics.jsonl   (label = stock-1, tencache-1, ...)
    <out>/<label>.profile.json (tencache runs: their step profile, for the least bytes per step)
    <out>/bench.json   <out>/bench.md   <out>/dashboard.png (with matplotlib)

Before launching anything the bench checks that the modules the runs need are importable (a missing one would
otherwise surface as a traceback inside the first training run), and measures the drive under --nvme-path as
tencache's own engine uses it (io/drive_rate.py, in `tencache-ds doctor`'s probe process; unless --nvme-bandwidth
gives a rate), for the I/O part of the bound.
"""
import contextlib
import copy
import dataclasses
import glob
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..bench import dashboard, report
from ..bench.records import both_forms
from ..config import AUTO, CONFIG_KEY, parse_config
from ..config_checks import check_host_budget, refuse_tilde
from ..errors import TencacheConfigError, TencacheResourceError
from ..io import folder_lock
from ..io.durable import replace_durably
from ..io.drive_rate import TRIAL_BYTES, DriveRate, store_thread_counts
from ..plan.budget import MachineResources
from ..preflight import checked_block
from ..units import fmt_bytes, parse_bytes
from .ds_config_file import read_ds_config
from .interrupts import interrupting_signals, restore_signals

TRAIN_SCRIPT_ENV = "TENCACHE_BENCH_TRAIN_SCRIPT"
# What scripts/train.py prints after every optimizer step: "step 3 loss 497.5228 time 0.37s".
STEP_LINE = re.compile(r"^step\s+(?P<step>\d+)\s+loss\s+(?P<loss>\S+)\s+time\s+(?P<time>[0-9.eE+-]+)s\b")
LOG_TAIL_LINES = 25
DASHBOARD_FILE = "dashboard.png"
# The pyproject.toml `bench` extra (pip name = module name; tests/cli/test_cli.py checks this against the file):
# transformers and accelerate for scripts/train.py (accelerate for transformers' DeepSpeed integration), tqdm for the
# progress bar, matplotlib for the figure. Only matplotlib is optional: without it there is no figure.
BENCH_EXTRA = ("transformers", "accelerate", "tqdm", "matplotlib")
OPTIONAL_MODULES = ("matplotlib",)
# What scripts/train.py imports besides the extra: deepspeed is a dependency of tencache-ds; torch is not (pip would
# pick a multi-GB CUDA build), so scripts/setup.sh installs the right build first.
TRAIN_MODULES = ("torch", "deepspeed")
REQUIRED_MODULES = TRAIN_MODULES + tuple(name for name in BENCH_EXTRA if name not in OPTIONAL_MODULES)


@dataclasses.dataclass
class RunSpec:
    """One child training run and where its files go."""

    arm: str
    repeat: int
    command: List[str]
    env: Dict[str, str]
    log_path: str
    result_path: str
    metrics_path: Optional[str]
    nvme_dir: str
    returncode: Optional[int] = None
    wall_s: Optional[float] = None

    @property
    def label(self) -> str:
        return f"{self.arm}-{self.repeat}"


class BenchError(RuntimeError):
    """The benchmark cannot run or a run failed; the message says which and where its log is."""


# ----------------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------------
def locate_train_script() -> Tuple[str, str]:
    """(repo root, scripts/train.py). TENCACHE_BENCH_TRAIN_SCRIPT wins; else next to the package, else under the
    current directory."""
    override = os.environ.get(TRAIN_SCRIPT_ENV)
    if override:
        script = os.path.abspath(override)
        if not os.path.isfile(script):
            raise BenchError(f"{TRAIN_SCRIPT_ENV}={override} is not a file")
        return os.path.dirname(os.path.dirname(script)), script
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for root in (package_root, os.getcwd()):
        script = os.path.join(root, "scripts", "train.py")
        if os.path.isfile(script):
            return root, script
    raise BenchError(f"scripts/train.py not found under {package_root} or {os.getcwd()}; run from a checkout of "
                     f"tencache_ds or set {TRAIN_SCRIPT_ENV}")


def check_model(repo_root: str, model: str, seq_len: int) -> None:
    """--model and --seq-len as scripts/train.py will take them (a name in configs/models/ or a JSON path; a sequence
    no longer than the model's position table), checked before anything runs or is written: the runs stopped there
    after the drive's probe and stock's start, with --out made."""
    models = os.path.join(repo_root, "configs", "models")
    path = model if model.endswith(".json") and os.path.exists(model) else os.path.join(models, model + ".json")
    if not os.path.isdir(models) and path != model:
        return  # a script of one's own (TENCACHE_BENCH_TRAIN_SCRIPT) outside a checkout: it knows its models
    if not os.path.isfile(path):
        known = sorted(name[:-5] for name in os.listdir(models) if name.endswith(".json"))
        raise BenchError(f"--model {model}: no such model ({path} does not exist); known: {', '.join(known)}")
    try:
        with open(path) as handle:
            config = json.load(handle)
    except (OSError, ValueError) as err:
        raise BenchError(f"--model {model}: {path} cannot be read as JSON: {err}") from None
    for key in ("n_positions", "max_position_embeddings"):  # (scripts/train.py max_positions)
        positions = config.get(key) if isinstance(config, dict) else None
        if positions:
            if isinstance(positions, int) and seq_len > positions:
                raise BenchError(f"--seq-len {seq_len} is longer than {model}'s position table ({key} {positions})")
            return


def load_ds_config(path: str) -> Dict[str, Any]:
    """The DeepSpeed config file both arms run with (JSON or HJSON), read as DeepSpeed reads it
    (cli/ds_config_file.py). A file: each run reads it again."""
    if not os.path.isfile(path):
        what = "is not a file" if os.path.exists(path) else "does not exist"
        raise BenchError(f"the DeepSpeed config {path} {what} (bench --config takes a JSON or HJSON file)")
    try:
        return read_ds_config(path)
    except TencacheConfigError as err:
        raise BenchError(str(err)) from None


def tencache_block(ds_config: Dict[str, Any], host_cache_bytes: Optional[str], device_cache_bytes: Optional[str],
                   metrics_path: Optional[str], profile_path: Optional[str] = None, ranks: int = 1) -> Dict[str, Any]:
    """The block for the tencache run: the config's own block (if any), enabled, with the budget options applied
    (None keeps the config's value, else "auto") and this run's metrics and profile files (a profile the
    config names would be shared by the repeats: each run records its own). Validated here, before any run.

    Raises:
        TencacheConfigError: the resulting block is invalid (the message names the key), or its host budget, per
            rank, is more than the node's memory for ``ranks`` ranks (what the run refuses at initialize).
        TencacheResourceError: with "pin_memory": "required", more than the node has available or may lock.
    """
    base = ds_config.get(CONFIG_KEY)
    if base is not None:  # the config's own block is valid as it stands ("enabled": "no", "tencache": "on" were
        parse_config(base)  # replaced quietly: helper-161's review); a valid one is then enabled for this arm
    block = dict(base) if isinstance(base, dict) else {}
    block["enabled"] = True
    for key, option in (("host_cache_bytes", host_cache_bytes), ("device_cache_bytes", device_cache_bytes)):
        if option is not None:
            block[key] = AUTO if option == AUTO else parse_bytes(option)
        block.setdefault(key, AUTO)
    if metrics_path:
        block["metrics_path"] = metrics_path
    if profile_path:
        block["profile_path"] = profile_path
    # what the tencache run would refuse at initialize (a budget above the node's memory), refused before stock's
    # run has trained for nothing
    machine = MachineResources.probe()  # (this process's own ranks on the node: the bench's runs have ``ranks``)
    check_host_budget(parse_config(block), dataclasses.replace(machine, local_world_size=max(1, ranks),
                                                               local_world_size_guessed=False))
    return block


def with_dtype(ds_config: Dict[str, Any], dtype: Optional[str]) -> Dict[str, Any]:
    """The config as scripts/train.py --dtype leaves it (None: as it is): its precision sections rewritten, the rest
    shared with ``ds_config``. (train.py cannot import this: its stock arms never import tencache_ds.)"""
    config = dict(ds_config)
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
        config.pop("fp16", None)
    elif dtype == "fp32":
        config.pop("bf16", None)
        config.pop("fp16", None)
    return config


def config_dtype(ds_config: Dict[str, Any]) -> str:
    """The training dtype ``ds_config``'s precision sections give: "bf16", "fp16" or "fp32"."""
    for name in ("bf16", "fp16"):
        section = ds_config.get(name)
        if isinstance(section, dict) and section.get("enabled"):
            return name
    return "fp32"


def replaced_config_values(ds_config: Dict[str, Any], dtype: str, micro_batch: int) -> List[str]:
    """What the bench's --dtype and --micro-batch (both with defaults) replace in the config every arm trains with,
    one sentence each: said, so that a config's fp32 run or micro-batch is not benchmarked as another unnoticed."""
    replaced = []
    if config_dtype(ds_config) != dtype:
        replaced.append(f"--dtype {dtype} replaces the config's {config_dtype(ds_config)}")
    configured = ds_config.get("train_micro_batch_size_per_gpu")
    if configured is not None and configured != micro_batch:
        replaced.append(f"--micro-batch {micro_batch} replaces the config's train_micro_batch_size_per_gpu "
                        f"{configured}")
    return replaced


def check_tencache_arm(ds_config: Dict[str, Any], block: Dict[str, Any], dtype: str, nvme_dir: str) -> None:
    """What the tencache run would refuse at initialize, refused before stock's run has trained for nothing and
    before ``--out`` is made: DeepSpeed's sections as scripts/train.py hands them to that run (its --dtype
    (with_dtype) and --nvme-path edits, repeated here: the script cannot import tencache_ds for its stock arms) with
    ``block``, through the run's own sequence (preflight.py: its sections and the files the block names; the host
    budget is checked where the block is built, for the bench's ranks: tencache_block).

    Raises:
        TencacheConfigError, TencacheResourceError: naming the key (e.g. ``--offload cpu``, whose config puts
            nothing on NVMe: zero_optimization.offload_param.device).
    """
    arm = with_dtype(copy.deepcopy(ds_config), dtype)
    arm[CONFIG_KEY] = block
    zero = arm.get("zero_optimization")
    for section in (zero.get(name) for name in ("offload_param", "offload_optimizer")) if isinstance(zero, dict) \
            else ():
        if isinstance(section, dict) and (section.get("device") == "nvme" or "nvme_path" in section):
            section["nvme_path"] = nvme_dir
    try:
        checked_block(arm)
    except (TencacheConfigError, TencacheResourceError) as err:
        # a path the bench made from an option of its own: the option named first (helper-244's review: the error
        # named zero_optimization.offload_param.nvme_path or tencache.metrics_path, keys the user never wrote)
        # (the files first: the swap folder's name is a prefix of theirs where --out and --nvme-path are one folder)
        for path, option in ((block.get("metrics_path"), "--out"), (block.get("profile_path"), "--out"),
                             (nvme_dir, "--nvme-path")):
            if path and path in str(err):
                raise type(err)(f"{option} {os.path.dirname(path)} (where the bench puts its run's "
                                f"{os.path.basename(path)}): {err}") from None
        raise


def missing_modules(names: Sequence[str]) -> List[str]:
    """The top-level modules in ``names`` that cannot be imported here (looked up, not imported)."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ValueError:  # imported already, without a __spec__: it is there
            found = True
        if not found:
            missing.append(name)
    return missing


def check_dependencies(required: Sequence[str] = REQUIRED_MODULES) -> None:
    """Raise BenchError naming every module of ``required`` that is missing and the command that installs it.

    Raises:
        BenchError: a module is missing (message: the names, ``pip install -e '.[bench]'`` and
            ``pip install <names>``; torch gets its own sentence).
    """
    missing = missing_modules(required)
    if not missing:
        return
    installable = [name for name in missing if name != "torch"]
    advice = []
    if installable:
        advice.append(f"install them with `pip install -e '.[bench]'` in the tencache_ds checkout, or "
                      f"`pip install {' '.join(installable)}`")
    if "torch" in missing:
        advice.append("install torch for this machine first (scripts/setup.sh picks the CPU or CUDA build)")
    raise BenchError(f"the benchmark needs {', '.join(missing)}, not importable here; " + "; ".join(advice))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The launcher's --master_port in a planned command: a free port is put there as the run starts (execute), not
# when the plan is made, minutes before, by which time another process may hold it.
PORT_AT_START = "<a free port as the run starts>"


def resolve_launcher(requested: str) -> str:
    """The launcher to use: the deepspeed one needs deepspeed.launcher.runner importable; else plain python."""
    if requested == "deepspeed":
        import importlib.util
        # find_spec("deepspeed.launcher.runner") would import deepspeed here (and its log lines would reach our
        # stdout); look for the file instead.
        spec = importlib.util.find_spec("deepspeed")
        folders = list(spec.submodule_search_locations or []) if spec else []
        if not any(os.path.isfile(os.path.join(folder, "launcher", "runner.py")) for folder in folders):
            print("bench: deepspeed.launcher.runner not found; falling back to --launcher python", file=sys.stderr)
            return "python"
    return requested


def build_runs(args, repo_root: str, train_script: str, config_path: str, ds_config: Dict[str, Any],
               out_dir: str, launcher: str) -> List[RunSpec]:
    """The interleaved run plan: stock-1, tencache-1[, stock-cpu-1], stock-2, tencache-2, ..."""
    specs = []
    arms = report.ARMS + ((report.STOCK_CPU,) if getattr(args, "compare", None) == "cpu" else ())
    for repeat in range(1, args.repeats + 1):
        for arm in arms:
            label = f"{arm}-{repeat}"
            metrics_path = os.path.join(out_dir, f"{label}.metrics.jsonl") if arm == report.TENCACHE else None
            profile_path = os.path.join(out_dir, f"{label}.profile.json") if arm == report.TENCACHE else None
            nvme_dir = os.path.join(os.path.abspath(args.nvme_path), label)
            block = "none"
            if arm == report.TENCACHE:
                tencache = tencache_block(ds_config, args.host_cache_bytes, args.device_cache_bytes, metrics_path,
                                          profile_path, ranks=getattr(args, "ranks", 1))
                check_tencache_arm(ds_config, tencache, args.dtype, nvme_dir)
                block = json.dumps(tencache)
            result_path = os.path.join(out_dir, f"{label}.result.json")
            train_args = [train_script, "--deepspeed_config", config_path, "--model", args.model,
                          "--steps", str(args.steps), "--micro-batch", str(args.micro_batch),
                          "--seq-len", str(args.seq_len), "--dtype", args.dtype, "--nvme-path", nvme_dir,
                          "--tencache-block", block, "--result-file", result_path, "--label", label,
                          # the same fp32-weights hash as the public per-parameter API, without re-reading every
                          # optimizer group once per parameter (minutes on gpt2-small)
                          "--weights-gather", "grouped"]
            if getattr(args, "grad_accum", None):
                train_args += ["--grad-accum", str(args.grad_accum)]
            if arm == report.STOCK_CPU:
                # what a user whose host memory holds the model runs: CPU offload with DeepSpeed's default stage-3
                # knobs (the config's may be there only to keep stock NVMe from crashing)
                train_args += ["--offload-device", "cpu", "--stage3-defaults"]
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo_root, env.get("PYTHONPATH")]))
            if launcher == "deepspeed":
                # On the CPU accelerator the launcher needs nothing more: local processes, gloo (checked with
                # deepspeed 0.19.8). --num_gpus keeps a multi-GPU machine to the ranks asked for.
                command = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus",
                           str(getattr(args, "ranks", 1)),
                           "--master_port", PORT_AT_START] + train_args
            else:
                # one process: the kernel chooses the rendezvous store's port as it binds it (scripts/train.py,
                # ensure_dist_env); a port picked now could be another process's by the time this run starts
                command = [sys.executable, "-u"] + train_args
                env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
            specs.append(RunSpec(arm, repeat, command, env, os.path.join(out_dir, f"{label}.log"), result_path,
                                 metrics_path, nvme_dir))
    return specs


# ----------------------------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------------------------
def _log_tail(path: str, num_lines: int = LOG_TAIL_LINES) -> str:
    with contextlib.suppress(OSError):
        with open(path, errors="replace") as fh:
            return "".join(fh.readlines()[-num_lines:])
    return ""


def execute(spec: RunSpec, progress) -> None:
    """Run one child to completion, its output to spec.log_path, each "step N ..." line advancing ``progress``;
    ``spec.command`` is given its free port first (PORT_AT_START), so that the log and bench.json hold the one used.

    Raises:
        BenchError: the child exited non-zero or wrote no result file (the message holds its log's tail).
    """
    # a profile left by an earlier bench in --out would be adopted: each run records its own (per rank: .rank<r>)
    profile_root = spec.result_path[:-len(".result.json")] + ".profile"
    # (and an archived result of that bench, bench/records.py: read in place of a run that wrote none)
    for path in both_forms(spec.result_path) + [spec.metrics_path] + glob.glob(glob.escape(profile_root) + "*.json"):
        if path and os.path.exists(path):
            os.remove(path)
    shutil.rmtree(spec.nvme_dir, ignore_errors=True)
    os.makedirs(spec.nvme_dir, exist_ok=True)
    progress.set_description(f"{spec.label} (starting)")
    spec.command = [str(free_port()) if part == PORT_AT_START else part for part in spec.command]
    started = time.perf_counter()
    with open(spec.log_path, "w") as log:
        log.write("# " + shlex.join(spec.command) + "\n")
        log.flush()
        process = subprocess.Popen(spec.command, env=spec.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, errors="replace", bufsize=1, start_new_session=True)
        try:
            for line in process.stdout:
                log.write(line)
                match = STEP_LINE.match(line.strip())
                if match:
                    progress.set_description(spec.label)
                    progress.set_postfix(step=match["step"], loss=match["loss"], time_s=match["time"])
                    progress.update(1)
            process.wait()
        except BaseException:  # Ctrl-C or anything else: do not leave the run (and its launcher's child) behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 9)
            process.wait()
            shutil.rmtree(spec.nvme_dir, ignore_errors=True)
            raise
    spec.returncode = process.returncode
    spec.wall_s = time.perf_counter() - started
    shutil.rmtree(spec.nvme_dir, ignore_errors=True)
    if process.returncode != 0 and _finished_but_teardown_aborted(spec):
        return
    if process.returncode != 0:
        raise BenchError(f"{spec.label} failed with exit code {process.returncode}; last lines of {spec.log_path}:\n"
                         + _log_tail(spec.log_path))
    if not os.path.exists(spec.result_path):
        raise BenchError(f"{spec.label} exited 0 but wrote no {spec.result_path}; see {spec.log_path}")


def run_all(specs: Sequence[RunSpec], execute_one: Callable[[RunSpec, Any], None], progress) -> Dict[str, str]:
    """Run ``specs`` in order with ``execute_one``; {arm: what its first crash was} for the arms whose crash is a
    result, whose other repeats are then skipped (each crashes again): stock NVMe's where a stock CPU offload arm
    runs beside it (stock NVMe crashes on configs tencache trains: small buffer_count, DeepSpeed's default reuse
    distance, 2 ranks...), and stock CPU offload's (on a model beyond the host's memory it is OOM-killed in
    initialize: stock NVMe and tencache are still compared; before, the whole bench was lost: helper-241). Any other
    run's failure raises, as does the crash of both stock arms (nothing left to compare tencache with)."""
    crashed: Dict[str, str] = {}
    arms = {spec.arm for spec in specs}
    for spec in specs:
        if spec.arm in crashed:
            continue
        try:
            execute_one(spec, progress)
        except BenchError as err:
            if not (spec.arm == report.STOCK_CPU or (spec.arm == report.STOCK and report.STOCK_CPU in arms)):
                raise
            crashed[spec.arm] = f"{spec.label} exited {spec.returncode}: {_crash_reason(spec.log_path)}"
            print(f"bench: {crashed[spec.arm]}; its log: {spec.log_path}", file=sys.stderr)
            if report.STOCK in crashed and report.STOCK_CPU in crashed:
                raise BenchError(f"both stock arms crashed ({crashed[report.STOCK]}; {crashed[report.STOCK_CPU]}): "
                                 f"nothing to compare tencache with") from err
    return crashed


def _crash_reason(log_path: str) -> str:
    """The last line of a failed run's log that names an error (else its last line)."""
    lines = [line.strip() for line in _log_tail(log_path, 200).splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or ["no output"])[-1][:300]


def _finished_but_teardown_aborted(spec: RunSpec) -> bool:
    """Stock DeepSpeed's aio handles occasionally abort the interpreter's teardown after a finished run
    ("terminate called without an active exception"); the result file is complete by then, so the run counts. Not
    tencache's runs, which make no such handle: an abort there is a failure (it was counted: helper-215)."""
    if spec.arm == report.TENCACHE or not os.path.exists(spec.result_path):
        return False
    with open(spec.log_path, errors="replace") as log:
        return "terminate called without an active exception" in log.read()


def start_probe(nvme_path: str, measure_bandwidth: bool, ds_config: Optional[Dict[str, Any]] = None
                ) -> Tuple[Any, Optional[str]]:
    """doctor's probe process (torch, DeepSpeed, the accelerator), measuring the drive under ``nvme_path`` (created
    if missing) as tencache's engine uses it, with as many requests in flight as the swappers of ``ds_config``
    issue, when asked and there is room for its files; returns the probe and why it does not measure (None when it
    does or was not asked to)."""
    from . import doctor
    why_not = None
    if measure_bandwidth:
        os.makedirs(nvme_path, exist_ok=True)
        free = shutil.disk_usage(nvme_path).free
        if free <= 2 * TRIAL_BYTES:
            why_not = f"{fmt_bytes(free)} free in {nvme_path}, less than {fmt_bytes(2 * TRIAL_BYTES)}"
    measure_here = measure_bandwidth and why_not is None
    probe = doctor.Probe(want_aio=False, bandwidth_dir=None, bandwidth_bytes=0,
                         drive_dir=os.path.abspath(nvme_path) if measure_here else None,
                         drive_threads=store_thread_counts(ds_config))
    return probe, why_not


def nvme_bandwidth(nvme_path: str, probe, given: Optional[int], why_not: Optional[str]
                   ) -> Tuple[Optional[report.NvmeBandwidth], Dict[str, Any]]:
    """The drive's rates for the bound, and what bench.json records about them: ``given`` (--nvme-bandwidth) for
    reads, writes and both at once, else the probe's measurement through tencache's engine (io/drive_rate.py):
    each direction's fastest rate, alone or beside the other, and the fastest combined. None, with the reason in
    the record, when it could not be measured."""
    if given is not None:
        return (report.NvmeBandwidth(float(given), float(given), "--nvme-bandwidth", float(given)),
                {"given_bytes_per_s": given})
    if why_not is not None:
        return None, {"error": why_not}
    facts = probe.facts()
    if "drive" not in facts:
        return None, {"error": f"the drive was not measured in {nvme_path}: "
                               f"{facts.get('drive_error') or probe.crash_text()}"}
    rate = DriveRate.from_dict(facts["drive"])
    bandwidth = report.NvmeBandwidth(max(rate.read_bytes_per_s, rate.both_read_bytes_per_s),
                                     max(rate.write_bytes_per_s, rate.both_write_bytes_per_s),
                                     f"measured: {rate.method}", rate.combined_bytes_per_s)
    return bandwidth, {"drive": facts["drive"]}


def describe_machine(nvme_path: str, probe) -> Dict[str, str]:
    """CPU, cores, RAM, accelerator and versions for bench.md (the accelerator through doctor's probe process)."""
    from .doctor import describe_host, mount_of, probe_gpus
    host = describe_host()
    gpus, why_none = probe_gpus()
    facts = probe.facts()
    accel = facts.get("accelerator") or {}
    versions = facts.get("versions") or {}
    mount = mount_of(os.path.realpath(nvme_path)) or {}
    machine = {
        "CPU": f"{host['cpu_brand']}, {host['logical_cores']} logical / {host['physical_cores']} physical cores",
        "RAM": f"{fmt_bytes(host['ram_total_bytes'])} ({fmt_bytes(host['ram_available_bytes'])} available at start)",
        "accelerator": (f"{accel['device_name']} (DeepSpeed '{accel['name']}', comm {accel['communication_backend']})"
                        if accel else f"unknown ({facts.get('accelerator_error') or facts.get('import_error')})"),
        "GPUs": "; ".join(f"{gpu['name']} ({fmt_bytes(gpu['total_bytes'])})" for gpu in gpus) or f"none ({why_none})",
        "NVMe path": f"{nvme_path} on {mount.get('fs_type', '?')} {mount.get('device', '?')}",
        "software": (f"python {platform.python_version()}, torch {versions.get('torch', '?')}, "
                     f"deepspeed {versions.get('deepspeed', '?')}, Linux {platform.release()}"),
    }
    return machine


def write_figure(args, runs: List[report.BenchRun], out_dir: str, title: str
                 ) -> Tuple[Optional[str], str, Tuple[str, ...]]:
    """The dashboard, unless --no-plots or matplotlib is missing. Returns (its path or None, what to say about it,
    the constant series it leaves out)."""
    plan = dashboard.plan_dashboard(runs)
    if args.no_plots:
        return None, "No figure (--no-plots).", plan.constants
    if not dashboard.matplotlib_available():
        return None, ("No figure: matplotlib is not installed (`pip install matplotlib`, part of the bench extra: "
                      "`pip install -e '.[bench]'`)."), plan.constants
    path = os.path.join(out_dir, DASHBOARD_FILE)
    try:
        drawn = dashboard.write_dashboard(plan, runs, path, args.warmup, title)
    except Exception as err:  # noqa: BLE001  (said in the summary: the runs' comparison is still written after it)
        # a figure that fails to draw (a full disk, a matplotlib error) left neither bench.json nor bench.md, the
        # summary of runs that took minutes (helper-186's review)
        return None, f"No figure: drawing it failed ({type(err).__name__}: {err}).", plan.constants
    if not drawn:
        return None, "No figure: no run has a per-step value to draw.", plan.constants
    return path, "", plan.constants


def _print_outputs(out_dir: str, specs: List[RunSpec], figure_path: Optional[str], figure_note: str) -> None:
    figure = f", {os.path.basename(figure_path)}" if figure_path else ""
    print(f"\nwritten to {out_dir}: bench.json, bench.md{figure}, " +
          ", ".join(os.path.basename(spec.log_path) for spec in specs))
    if figure_note:
        print(f"bench: {figure_note}")


def run(args) -> int:
    """`tencache-ds bench`. Exit code 0 when all runs finished (whether or not they match), 1 on failure."""
    try:
        return _run(args)
    except (BenchError, TencacheConfigError, TencacheResourceError, ValueError, OSError) as err:
        print(f"bench: {err}", file=sys.stderr)  # (an OSError names its path: --nvme-path not a folder, say)
        return 1
    except KeyboardInterrupt:  # execute() has already stopped the running child
        print(f"bench: interrupted; the logs so far are in {os.path.abspath(args.out)}", file=sys.stderr)
        return 130


def _run(args) -> int:
    if args.warmup >= args.steps:
        raise BenchError(f"--warmup {args.warmup} leaves no measured step of --steps {args.steps}")
    for option, path in (("--nvme-path", args.nvme_path), ("--out", args.out)):
        # (`--nvme-path=~/x`: the shell expands no "~" after "=", nothing else does)
        refuse_tilde(option, str(path), "the bench would write into")
    check_dependencies()
    repo_root, train_script = locate_train_script()
    check_model(repo_root, args.model, args.seq_len)
    config_path = os.path.abspath(args.config or os.path.join(repo_root, "configs", f"stock-{args.offload}.json"))
    ds_config = load_ds_config(config_path)
    out_dir = os.path.abspath(args.out)
    launcher = resolve_launcher(args.launcher)
    if getattr(args, "ranks", 1) > 1 and launcher != "deepspeed":
        raise BenchError(f"--ranks {args.ranks} needs the deepspeed launcher (--launcher deepspeed, and "
                         "deepspeed.launcher.runner importable)")
    ancestor = out_dir  # checked before the runs' files in it are (build_runs), whose messages would name those
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise BenchError(f"--out {out_dir} cannot be created: {ancestor} is a file, not a folder")
    specs = build_runs(args, repo_root, train_script, config_path, ds_config, out_dir, launcher)
    args.replaced_config_values = replaced_config_values(ds_config, args.dtype, args.micro_batch)
    for sentence in args.replaced_config_values:
        print(f"bench: {sentence} (in every arm)", file=sys.stderr)
    # Every argument checked first: a refused bench leaves no folder behind. Then --nvme-path is held for the whole
    # bench: two benches given the same one (the default, say) would use the same run folders, each emptying the
    # other's live swap files before its own runs (io/folder_lock.py).
    try:
        nvme_lock = folder_lock.hold(bench_lock_folder(args.nvme_path))
    except folder_lock.FolderInUse as err:
        raise BenchError(f"--nvme-path {args.nvme_path} is in use by another bench ({err.holder}); give this one a "
                         f"--nvme-path of its own") from None
    except OSError as err:
        raise BenchError(f"--nvme-path {args.nvme_path} cannot hold the bench's lock: {err}") from None
    try:
        return _run_holding_the_nvme_path(args, specs, config_path, ds_config, out_dir, launcher, train_script)
    finally:
        folder_lock.let_go(nvme_lock)


def bench_lock_folder(nvme_path: str) -> str:
    """What a bench holds (io/folder_lock.py) for its whole run: a name inside ``--nvme-path`` (its lock file goes
    beside it, so inside ``--nvme-path`` too: a mount point's parent may take no new file), which no run empties."""
    return os.path.join(os.path.abspath(nvme_path), ".bench")


def _write_replacing(path: str, write: Callable[[Any], None]) -> None:
    """``write(handle)`` into a temporary file beside ``path``, then renamed over it: a bench killed while writing
    leaves the whole new file or none (the last bench's was removed at the start), never a truncated one that a
    later reader (validate_estimate.py --reprice) stops on."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w") as handle:
            write(handle)
        replace_durably(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)


def _run_holding_the_nvme_path(args, specs: List[RunSpec], config_path: str, ds_config: Dict[str, Any],
                               out_dir: str, launcher: str, train_script: str) -> int:
    from tqdm import tqdm  # (checked by check_dependencies: part of the bench extra)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise BenchError(f"--out {out_dir} cannot be created: {err}") from None
    # An earlier bench's summary in --out would stand beside this one's logs if this one fails: it goes now.
    for path in both_forms(os.path.join(out_dir, "bench.json")) + [os.path.join(out_dir, name)
                                                                   for name in ("bench.md", DASHBOARD_FILE)]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    given_bandwidth = getattr(args, "nvme_bandwidth", None)
    # SIGTERM (a CI timeout, `kill`) and SIGHUP (the terminal or ssh session closed) take the same path as Ctrl-C,
    # from the drive's probe on, so the probe and the running child are stopped, not orphaned (before, SIGHUP
    # killed the bench alone, and a probe was never stopped: helper-215).
    previous_handlers = interrupting_signals()
    try:
        probe, why_not_measured = start_probe(args.nvme_path, measure_bandwidth=given_bandwidth is None,
                                              ds_config=ds_config)
        try:
            machine = describe_machine(args.nvme_path, probe)
            machine["launcher"] = launcher if getattr(args, "ranks", 1) == 1 else f"{launcher}, {args.ranks} ranks"
            bandwidth, bandwidth_record = nvme_bandwidth(args.nvme_path, probe, given_bandwidth, why_not_measured)
        except BaseException:
            probe.stop()
            raise
        machine["NVMe bandwidth"] = (bandwidth.describe() if bandwidth else
                                     f"not measured ({bandwidth_record['error']})")
        started = time.perf_counter()
        with tqdm(total=len(specs) * args.steps, unit="step", dynamic_ncols=True, file=sys.stderr) as progress:
            crashed = run_all(specs, execute, progress)
        stock_crashed = crashed.get(report.STOCK)
    finally:
        restore_signals(previous_handlers)
    total_s = time.perf_counter() - started

    finished = [spec for spec in specs if spec.returncode is not None and os.path.exists(spec.result_path)]
    runs = [report.BenchRun(spec.arm, spec.repeat, report.load_result(spec.result_path),
                            report.load_metrics_rows(spec.metrics_path)) for spec in finished]
    comparison = report.compare(runs, args.warmup, bandwidth, stock_crashed=stock_crashed,
                                drive_tbw_bytes=getattr(args, "drive_tbw", None),
                                ranks_per_drive=getattr(args, "ranks", 1))  # every rank writes under --nvme-path
    comparison.notes.extend(f"{sentence}, in every arm" for sentence in getattr(args, "replaced_config_values", ()))
    if report.STOCK_CPU in crashed:
        comparison.notes.append(f"stock CPU offload did not finish ({crashed[report.STOCK_CPU]}): compared without "
                                f"it" + ("" if any(run.arm == report.STOCK_CPU for run in runs) else
                                         ", no repeat of it having finished"))
    figure_path, figure_note, constants = write_figure(args, runs, out_dir, f"{args.model}: tencache vs stock")
    child_commands = [shlex.join(spec.command) for spec in specs if spec.returncode is not None]

    print(report.render_table(comparison))
    bench_json = os.path.join(out_dir, "bench.json")
    summary = {"command_line": args.command_line, "machine": machine, "total_wall_s": total_s,
               "settings": {key: value for key, value in vars(args).items() if key != "command_line"},
               "config_path": config_path, "train_script": train_script,
               # a run not made (stock's repeats after its crash) has no command: its port was never chosen
               "runs": [{"label": spec.label, "arm": spec.arm, "repeat": spec.repeat,
                         "command": spec.command if spec.returncode is not None else None,
                         "log": spec.log_path, "result": spec.result_path, "metrics": spec.metrics_path,
                         "wall_s": spec.wall_s, "returncode": spec.returncode} for spec in specs],
               "nvme_bandwidth": dict(bandwidth_record, **(dataclasses.asdict(bandwidth) if bandwidth else {})),
               "comparison": comparison.to_dict(),
               "figure": os.path.relpath(figure_path, out_dir) if figure_path else None,
               "figure_note": figure_note, "constant_series": list(constants)}
    _write_replacing(bench_json, lambda fh: json.dump(summary, fh, indent=1, default=str))
    markdown = report.render_markdown(comparison, args.command_line, machine, child_commands,
                                      os.path.relpath(figure_path, out_dir) if figure_path else None, figure_note,
                                      constants)
    _write_replacing(os.path.join(out_dir, "bench.md"), lambda fh: fh.write(markdown))
    _print_outputs(out_dir, specs, figure_path, figure_note)
    print(f"bench: {len(specs)} runs in {total_s:.0f} s")
    return 0
