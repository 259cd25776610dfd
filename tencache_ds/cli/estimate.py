"""`tencache-ds estimate`: before launch, whether a model fits, how fast a step is under stock ZeRO-Infinity and under
tencache, and what it costs the drive. Owns: reading the inputs (a Hugging Face config.json, the DeepSpeed config,
a machine file or ``this`` machine, measured), and the report: at most ~15 lines, or one JSON object. Does not own
the numbers (plan/step_model/ computes them; cli/calibrate.py measures this machine).

    tencache-ds estimate --model configs/models/llama-7b.json --ds-config ds_config.json \\
        --machine configs/machines/h100x1-2nvme.json [--micro-batch 1 --seq 2048 --gas 8] [--json]
        [--profile runs/profile.json]   # the run's measured compute instead of the machine's (its reads reported)

Every bad input is an error that names the file and the key, with exit code 2; nothing is written.
"""
import dataclasses
import json
import os
import shutil
import socket
import sys
from typing import Any, Dict, List, Optional, Tuple

from ..config import CONFIG_KEY, config_of_ds_dict
from ..drive_wear import fmt_decimal_tb
from ..errors import TencacheConfigError, TencacheResourceError
from ..units import fmt_bytes
from ..zero_sections import reject_nested_blocks
from .ds_config_file import read_ds_config

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS_DIR = os.path.join(REPO_ROOT, "configs", "models")
THIS = "this"
# the printed names of the step's parts (plan/step_model/results.py, CRITICAL_PARTS, in that order)
PART_NAMES = {"compute": "compute", "collective": "collective", "h2d": "H2D", "nvme_read": "NVMe read",
              "nvme_write": "NVMe write", "cpu_adam": "CPU Adam"}


def _read_json(path: str, what: str) -> Any:
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise TencacheConfigError(f"{what} {path} does not exist") from None
    except (OSError, ValueError) as err:
        raise TencacheConfigError(f"{what} {path} cannot be read as JSON: {err}") from None


def model_config_path(model: str) -> str:
    """A path, or a name in configs/models/ (``gpt2-small``)."""
    if os.path.exists(model) or model.endswith(".json"):
        return model
    return os.path.join(MODELS_DIR, f"{model}.json")


def build_inputs(args) -> Dict[str, Any]:
    """Read and check every input (and, with ``--machine this``, measure the machine, written to
    ``--save-machine`` once every input has been read). Raises TencacheConfigError naming the file and the key."""
    from ..plan.machine import load_machine, measured_differently
    from ..plan.model_shapes import model_shape
    from ..plan.workload import ZeroSettings, build_workload

    model_path = model_config_path(args.model)
    model_config = _read_json(model_path, "model config")
    if not isinstance(model_config, dict):
        raise TencacheConfigError(f"model config {model_path}: a Hugging Face config.json is a JSON object")
    shape = model_shape(model_config, source=f"model config {model_path}")
    args.seq = sequence_length(model_config, args.seq, model_path)
    ds_config = read_ds_config(args.ds_config)
    reject_nested_blocks(ds_config)  # (a misplaced or misspelled block: the run stops on it, stock's or tencache's)
    ds_config, filled = filled_as_the_trainer_fills(ds_config, shape.hidden, args.ds_config)
    zero = ZeroSettings.from_ds_config(ds_config, source=f"DeepSpeed config {args.ds_config}")
    if args.machine != THIS:  # (read first: the batch shape follows from the ranks, as DeepSpeed derives it)
        machine = load_machine(args.machine)
    ranks = machine.world_size if args.machine != THIS else _visible_gpus()
    micro_batch, gas = batch_shape(ds_config, args.ds_config, ranks, args.micro_batch, args.gas)
    # (the calibration's compute dtype; "bfloat16" is DeepSpeed's old name for the bf16 block)
    dtype = next((name for key, name in (("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16"))
                  if (ds_config.get(key) or {}).get("enabled")), "fp32")
    measured_for = {"host": socket.gethostname(), "model": os.path.basename(model_path),
                    "micro_batch": str(micro_batch), "seq": str(args.seq), "dtype": dtype}
    if args.machine != THIS:
        differs = measured_differently(machine, measured_for)
        if differs:  # its compute figures are another model's, or another host's (helper-212)
            print(f"tencache-ds estimate: warning: machine file {args.machine} was measured for another run ("
                  + ", ".join(f"{name} {then} there, {now} here" for name, (then, now) in differs.items())
                  + "): its compute figures are that model's and host's; `--machine this` measures this one",
                  file=sys.stderr)
    sections = _profile_sections(args)  # (read before a calibration of a minute, which a bad profile would waste)
    if sections is not None:  # ... and checked against this model and config then (helper-194)
        from ..plan.profile_timings import check_profile_fits
        check_profile_fits(build_workload(shape, zero, ranks, micro_batch, args.seq, gas, args.checkpointing),
                           sections, source=f"profile {args.profile}")
    measured_machine = None
    if args.save_machine:
        _check_writable(args.save_machine, args.machine)
    if getattr(args, "nvme_path", None) is not None and args.machine != THIS:  # (it was ignored, silently)
        raise TencacheConfigError(f"--nvme-path names the folder `--machine {THIS}` measures; with --machine "
                                  f"{args.machine} nothing is measured")
    if args.machine == THIS:
        from .calibrate import PROBE_TIMEOUT_S, calibrate, machine_from_calibration
        keep = "" if args.save_machine else "; --save-machine PATH keeps the figures for --machine PATH"
        drive_folder, named_by = measured_folder(args.nvme_path, ds_config, args.ds_config)
        print(f"tencache-ds estimate: measuring this machine (the drive in {drive_folder}, {named_by}; CPU Adam, the "
              f"model's layers; up to {PROBE_TIMEOUT_S / 60:.0f} min){keep}", file=sys.stderr, flush=True)
        measured = calibrate(drive_folder, model_config, micro_batch, args.seq, dtype,
                             ds_config=ds_config,
                             progress=lambda line: print(f"tencache-ds estimate: {line}", file=sys.stderr, flush=True))
        calibrated = machine_from_calibration(measured)
        free, free_source = _swap_files_room(ds_config, drive_folder)
        machine = measured_machine = dataclasses.replace(calibrated, nvme_free_bytes=free,
                                                         sources={**calibrated.sources, "nvme_free_bytes": free_source},
                                                         measured_for=measured_for)
        busy = _busy(machine)
        if busy:
            print(f"tencache-ds estimate: warning: {busy}", file=sys.stderr)
    workload = build_workload(shape, zero, machine.world_size, micro_batch, args.seq, gas, args.checkpointing)
    profile_notes: List[str] = []
    if sections is not None:
        from ..plan.profile_timings import machine_from_profile
        machine, profile_notes = machine_from_profile(machine, workload, sections, source=f"profile {args.profile}")
        # the profile records neither the micro-batch nor the sequence (nor checkpointing in the model): its step's
        # compute is taken as measured, whatever these options say (helper-194: its rate was scaled by them)
        profile_notes.append("the step's compute is the profiled run's, at its micro-batch, sequence and activation "
                             "checkpointing: --micro-batch, --seq and --activation-checkpointing do not change it")
    if args.save_machine:  # the machine measured (before a profile's timings), once every input has been read
        try:
            with open(args.save_machine, "w") as handle:
                json.dump(measured_machine.to_json(), handle, indent=2)
                handle.write("\n")
        except OSError as err:
            raise TencacheConfigError(f"--save-machine {args.save_machine} cannot be written: {err}") from None
    if zero.tencache is not None:  # an explicit budget the run would refuse on that machine (after a measured
        # machine is saved: its minute of calibration is not lost to this)
        from ..config_checks import check_host_budget
        from ..plan.step_model.tencache import described_resources
        check_host_budget(zero.tencache, described_resources(workload, machine))
    return {"model_path": model_path, "shape": shape, "zero": zero, "machine": machine, "workload": workload,
            "micro_batch": micro_batch, "gas": gas, "dtype": dtype, "profile_notes": profile_notes,
            "ds_config": ds_config, "filled": filled}


# The stage-3 sizes Hugging Face's Trainer fills where its DeepSpeed config says "auto", from the model's hidden size
# (transformers' integrations/deepspeed.py, trainer_config_finalize), as a function of it.
TRAINER_FILLS = {"reduce_bucket_size": lambda hidden: hidden * hidden,
                 "stage3_prefetch_bucket_size": lambda hidden: int(0.9 * hidden * hidden),
                 "stage3_param_persistence_threshold": lambda hidden: 10 * hidden}


def filled_as_the_trainer_fills(ds_config: Dict[str, Any], hidden: int, path: str) -> Tuple[Dict[str, Any], List[str]]:
    """A Hugging Face Trainer's DeepSpeed config (its documented ZeRO-3 one has "auto" values, which the Trainer
    fills in at launch): the stage-3 sizes filled as the Trainer fills them from the model (``TRAINER_FILLS``), each
    said; the batch sizes are the estimate's own (``batch_shape``). A precision left to the Trainer's arguments is
    refused naming its key: the estimate cannot know it. (Until 2026-12-08 the documented config was refused on its
    first "auto", a size; and "auto" read as enabled would have priced bf16.)"""
    for key in ("fp16", "bf16", "bfloat16"):
        if isinstance(ds_config.get(key), dict) and ds_config[key].get("enabled") == "auto":
            raise TencacheConfigError(
                f'DeepSpeed config {path}: {key}.enabled is "auto", which Hugging Face\'s Trainer fills from its '
                f'--{key} argument: set it to true or false for the estimate')
    zero = ds_config.get("zero_optimization")
    auto = [key for key in TRAINER_FILLS if isinstance(zero, dict) and zero.get(key) == "auto"]
    if not auto:
        return ds_config, []
    filled = {key: TRAINER_FILLS[key](hidden) for key in auto}
    return {**ds_config, "zero_optimization": {**zero, **filled}}, [
        "\"auto\" filled as Hugging Face's Trainer fills it from the model's hidden size " + str(hidden) + ": "
        + ", ".join(f"{key} {value}" for key, value in filled.items())]


def _profile_sections(args):
    """The sections of ``--profile``, or None without one. Raises TencacheConfigError naming the file."""
    if not getattr(args, "profile", None):
        return None
    from ..profile.store import read_sections
    try:
        return read_sections(args.profile)
    except (OSError, ValueError) as err:
        raise TencacheConfigError(f"profile {args.profile} cannot be read: {err}") from None


def _check_writable(path: str, machine: str) -> None:
    """``--save-machine`` saves a measured machine: refused without ``--machine this``, and where its folder cannot
    take the file, before anything is measured."""
    if machine != THIS:
        raise TencacheConfigError(f"--save-machine saves the machine `--machine {THIS}` measures; with --machine "
                                  f"{machine} there is nothing measured to save")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK) or (
            os.path.exists(path) and not os.access(path, os.W_OK)):
        raise TencacheConfigError(f"--save-machine {path} cannot be written (a folder, or a folder missing or "
                                  f"read-only)")


def _busy(machine) -> Optional[str]:
    """Why the measured figures understate the machine, if it was busy while measured (more runnable tasks than
    cores): each probe then gets a share of a core, and compute, CPU Adam and NVMe come out low."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cores = os.cpu_count() or 1
    if load <= cores:
        return None
    return (f"this machine was busy while measured (1-minute load {load:.1f} on {cores} cores): the figures are "
            f"below what it does when quiet, and so are the predictions; measure again when it is quiet, or save "
            f"a quiet measurement with --save-machine and pass that file")


def _positive(config: Dict[str, Any], key: str, path: str) -> Optional[int]:
    """``key``'s value, None where it is absent or "auto" (a Hugging Face Trainer fills those in); a whole float
    (64.0) as DeepSpeed's arithmetic takes it."""
    value = config.get(key)
    if value is None or value == "auto":
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TencacheConfigError(f"DeepSpeed config {path}: {key} must be a positive integer, got {value!r}")
    return value


def batch_shape(config: Dict[str, Any], path: str, ranks: int, micro_batch: Optional[int] = None,
                gas: Optional[int] = None) -> Tuple[int, int]:
    """(micro-batch per rank, gradient accumulation steps) as DeepSpeed derives them (runtime/config.py
    ``_set_batch_related_parameters``) from the config's ``train_batch_size``, ``train_micro_batch_size_per_gpu`` and
    ``gradient_accumulation_steps`` at ``ranks`` ranks; ``--micro-batch`` and ``--gas`` given replace the config's.
    Neither batch size given: a micro-batch of 1 (DeepSpeed would refuse the config). Until 2026-12-07 a missing one
    was taken for 1: a config with ``train_batch_size`` 64 alone was priced at a micro-batch of 1 (helper-176)."""
    train_batch = _positive(config, "train_batch_size", path)
    given_micro_batch, given_gas = micro_batch, gas
    micro_batch = micro_batch or _positive(config, "train_micro_batch_size_per_gpu", path)
    gas = gas or _positive(config, "gradient_accumulation_steps", path)
    ranks = max(1, ranks // (_positive(config, "sequence_parallel_size", path) or 1))  # DeepSpeed's data ranks
    if None not in (train_batch, micro_batch, gas) and not (given_micro_batch or given_gas) \
            and train_batch != micro_batch * gas * ranks:  # DeepSpeed's _batch_assertion
        raise TencacheConfigError(
            f"DeepSpeed config {path}: train_batch_size {train_batch} is not train_micro_batch_size_per_gpu "
            f"{micro_batch} x gradient_accumulation_steps {gas} x {ranks} rank(s) (DeepSpeed refuses it)")
    if micro_batch is None and train_batch is not None:
        gas = gas or 1
        micro_batch = train_batch // max(1, ranks) // gas
        what = f"train_batch_size {train_batch} / {ranks} rank(s) / gradient_accumulation_steps {gas}"
    elif gas is None and train_batch is not None:
        gas = train_batch // micro_batch // max(1, ranks)
        what = f"train_batch_size {train_batch} / train_micro_batch_size_per_gpu {micro_batch} / {ranks} rank(s)"
    else:
        micro_batch, gas, what = micro_batch or 1, gas or 1, None
    if micro_batch < 1 or gas < 1:
        raise TencacheConfigError(f"DeepSpeed config {path}: {what} leaves less than one sample a step")
    if what is not None and not (given_micro_batch or given_gas) and train_batch != micro_batch * gas * ranks:
        # derived with a remainder: DeepSpeed's _batch_assertion refuses it at initialize (helper-212)
        raise TencacheConfigError(
            f"DeepSpeed config {path}: train_batch_size {train_batch} is no whole multiple of {what.split(' / ', 1)[1]}"
            f" (DeepSpeed refuses it: {micro_batch} x {gas} x {ranks} rank(s) is {micro_batch * gas * ranks})")
    return micro_batch, gas


# the model types whose positions are a learned table: a sequence longer than it stops the first forward pass;
# (its key, Hugging Face's default where a config.json leaves it out)
LEARNED_POSITIONS = {"gpt2": ("n_positions", 1024), "opt": ("max_position_embeddings", 2048)}


def _swap_files_room(ds_config: Dict[str, Any], measured: str) -> Tuple[Optional[int], str]:
    """The free bytes the swap files have, and where it was read: the measured folder's file system, where every
    nvme_path of the config is on it; not known where they are on several, or on another one (the parameters' bytes
    were charged to the optimizer's drive: helper-179)."""
    from .doctor_checks import nvme_paths_from_config
    folders = list(nvme_paths_from_config(ds_config).values()) or [measured]
    devices = {_device_of(folder) for folder in folders + [measured]}
    if len(devices) > 1 or None in devices:
        return None, (f"not known: the swap files ({', '.join(folders)}) and the folder measured ({measured}) are on "
                      f"more than one file system")
    return _free_bytes(measured), f"free space in {measured} when measured"


def _existing(folder: str) -> str:
    """``folder``, or its nearest existing parent (the measurement removes what it made)."""
    path = os.path.abspath(folder)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _device_of(folder: str) -> Optional[int]:
    try:
        return os.stat(_existing(folder)).st_dev
    except OSError:
        return None


def _free_bytes(folder: str) -> Optional[int]:
    """Free bytes on the file system of ``folder``; None where none can be read."""
    try:
        return shutil.disk_usage(_existing(folder)).free
    except OSError:
        return None


def measured_folder(nvme_path: Optional[str], ds_config: Dict[str, Any], ds_config_path: str) -> Tuple[str, str]:
    """The folder ``--machine this`` measures the drive in, and what named it: ``--nvme-path``, else the config's
    nvme_path (the optimizer's, which moves most of the bytes, where both are on NVMe), else the default. The
    config's was ignored: the default folder (often the root disk, or a tmpfs) was measured for a run whose swap
    files go elsewhere (helper-176)."""
    from .doctor import DEFAULT_NVME_PATH
    from .doctor_checks import nvme_paths_from_config
    if nvme_path is not None:
        return nvme_path, "--nvme-path"
    paths = nvme_paths_from_config(ds_config)
    for key in ("zero_optimization.offload_optimizer.nvme_path", "zero_optimization.offload_param.nvme_path"):
        if key in paths:
            return paths[key], f"{key} in {ds_config_path}"
    return DEFAULT_NVME_PATH, "the default folder: the config names none"


DEFAULT_SEQ = 2048


def sequence_length(model_config: Dict[str, Any], seq: Optional[int], path: str) -> int:
    """``--seq``, refused where it is longer than the model's learned position table (the first forward pass would
    stop: helper-176, where the default 2048 was priced for gpt2-tiny's 256); not given: DEFAULT_SEQ, or the table's
    length where shorter."""
    key, default = LEARNED_POSITIONS.get(model_config.get("model_type"), (None, None))
    positions = model_config.get(key, default) if key else None
    if not isinstance(positions, int) or isinstance(positions, bool) or positions < 1:
        return seq or DEFAULT_SEQ
    if seq is None:
        return min(DEFAULT_SEQ, positions)
    if seq > positions:
        raise TencacheConfigError(f"model config {path}: --seq {seq} is longer than its position table ({key} "
                                  f"{positions}): the first forward pass would stop; pass --seq {positions} or less")
    return seq


def _visible_gpus() -> int:
    """The ranks ``--machine this`` runs: one per GPU CUDA sees (as its measurement counts them), else one."""
    try:
        import torch
        return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
    except Exception:  # noqa: BLE001  (no usable CUDA: one rank on the host)
        return 1


def estimate(args) -> Dict[str, Any]:
    """The report as a JSON-able dict (what --json prints)."""
    from ..plan.step_model import STOCK, TENCACHE, drive_days_to_tbw, fits, predict

    inputs = build_inputs(args)
    machine, workload = inputs["machine"], inputs["workload"]
    predictions = predict(workload, machine)
    tbw = args.drive_tbw if args.drive_tbw is not None else machine.drive_tbw_bytes
    report: Dict[str, Any] = {
        "model": inputs["model_path"], "parameters": inputs["shape"].num_params, "machine": machine.name,
        "world_size": machine.world_size, "micro_batch": inputs["micro_batch"], "seq": args.seq,
        "gas": inputs["gas"], "activation_checkpointing": args.checkpointing, "dtype": inputs["dtype"],
        "master_element_bytes": workload.zero.precision.master_bytes,
        "optimizer_state_element_bytes": workload.zero.precision.state_bytes,
        "optimizer_state_tensors": list(workload.zero.precision.state_names),
        "optimizer_state_known": workload.zero.precision.state_known, "drive_tbw_bytes": tbw,
    }
    fit = {name: fits(prediction, workload, machine) for name, prediction in predictions.items()}
    for name, reason in refusals_at_initialize(inputs["ds_config"], inputs["zero"]).items():
        fit[name] = (False, fit[name][1] + [reason])
    report["fits"] = fit[TENCACHE][0]
    report["fits_stock"] = fit[STOCK][0]
    report["why_not"] = {name: reasons for name, (_ok, reasons) in fit.items()}
    report["needs"] = dict(predictions[TENCACHE].memory)
    report["needs_stock"] = dict(predictions[STOCK].memory)
    report["budgets"] = predictions[TENCACHE].budgets
    report["step_time_s"] = {name: p.step_time_s for name, p in predictions.items()}
    report["critical_path_s"] = {name: p.critical_path_s for name, p in predictions.items()}
    report["bottleneck"] = {name: p.bottleneck for name, p in predictions.items()}
    report["nvme_read_bytes_per_step"] = {name: p.nvme_read_bytes for name, p in predictions.items()}
    report["nvme_write_bytes_per_step"] = {name: p.nvme_write_bytes for name, p in predictions.items()}
    report["hit_rates"] = {"device": predictions[TENCACHE].device_hit_rate,
                           "host": predictions[TENCACHE].host_hit_rate}
    report["drive_days_to_tbw"] = {name: drive_days_to_tbw(p, machine, tbw) for name, p in predictions.items()}
    report["machine_figures"] = machine.to_json()
    report["profile"] = {"path": getattr(args, "profile", None), "used": inputs["profile_notes"]}
    report["filled"] = inputs["filled"]
    block = inputs["ds_config"].get(CONFIG_KEY)
    report["tencache_block_disabled"] = isinstance(block, dict) and not config_of_ds_dict(inputs["ds_config"]).enabled
    return report


def refusals_at_initialize(ds_config: Dict[str, Any], zero) -> Dict[str, str]:
    """Why the run stops at start-up, whatever the machine, by arm (``stock``, ``tencache``; none where it starts):
    the checks of DeepSpeed's sections tencache makes at deepspeed.initialize, but the swap folders' (they may be on
    another machine), and hpZ copies on NVMe, which stop stock's zero.Init too (helper-194: "fits: yes" for both).
    A config that offloads nothing to NVMe is priced as stock for both (``zero``: its ZeroSettings), but where its
    "tencache" block is enabled: the run refuses that (it would silently be stock: helper-206)."""
    from ..plan.step_model import STOCK, TENCACHE
    from ..zero_sections import check_zero_sections_but_folders, deepspeed_refusal, secondary_partitions_on_nvme

    refusals = {}
    section = ds_config.get("zero_optimization")
    hpz = secondary_partitions_on_nvme(section) if isinstance(section, dict) else None
    if hpz is not None:
        refusals[STOCK] = f"DeepSpeed stops in zero.Init: {hpz}"
    try:
        if "nvme" in (zero.offload_param, zero.offload_optimizer) or zero.tencache is not None:
            check_zero_sections_but_folders(ds_config)
    except TencacheConfigError as err:
        refusals[TENCACHE] = f"tencache refuses it at deepspeed.initialize: {err}"
    # what DeepSpeed's own config models refuse (a misspelt key was priced at DeepSpeed's default: helper-244)
    refused = deepspeed_refusal(ds_config)
    if refused is not None:
        for arm in (STOCK, TENCACHE):
            refusals.setdefault(arm, f"deepspeed.initialize stops: {refused}")
    return refusals


def render(report: Dict[str, Any]) -> List[str]:
    """At most 15 lines."""
    def seconds(value):
        return f"{value:.3g} s"

    stock, tencache = report["step_time_s"]["stock"], report["step_time_s"]["tencache"]
    needs, budgets = report["needs"], report["budgets"]
    profile = report.get("profile") or {}
    lines = [f"estimate: {os.path.basename(report['model'])} ({report['parameters'] / 1e9:.3g} B parameters) on "
             f"{report['machine']} ({report['world_size']} rank(s)); micro-batch {report['micro_batch']} x "
             f"{report['seq']} tokens, GAS {report['gas']}, {report['dtype']}"
             + (", activation checkpointing" if report["activation_checkpointing"] else "")
             + _narrow_optimizer(report)
             + (f"; from profile {profile['path']}: " + "; ".join(profile["used"]) if profile.get("path") else "")
             + "".join(f"; {note}" for note in report.get("filled") or ())
             # (doctor says so too: a disabled block was priced as tencache without a word; helper-244)
             + ("; the config's \"tencache\" block has enabled false, so the run would be stock DeepSpeed's: the "
                "tencache figures are what enabling it would give" if report.get("tencache_block_disabled") else "")]
    for name, label in (("tencache", "tencache"), ("stock", "stock")):
        ok = report["fits"] if name == "tencache" else report["fits_stock"]
        why = "; ".join(report["why_not"][name])
        lines.append(f"fits ({label}): " + ("yes" if ok else f"NO: {why}"))
    lines.append(f"needs per rank (tencache): device {fmt_bytes(needs['device'])}, pinned host "
                 f"{fmt_bytes(needs['pinned'])}, pageable host {fmt_bytes(needs['pageable'])}, NVMe "
                 f"{fmt_bytes(needs['nvme'])}")
    stock_needs = report["needs_stock"]
    lines.append(f"needs per rank (stock):    device {fmt_bytes(stock_needs['device'])}, pinned host "
                 f"{fmt_bytes(stock_needs['pinned'])}, pageable host {fmt_bytes(stock_needs['pageable'])}, NVMe "
                 f"{fmt_bytes(stock_needs['nvme'])}")
    lines.append(_budgets_line(budgets))
    # a policy that does not fit is priced all the same (what its step would take), said beside its figure
    runs = {"stock": report["fits_stock"], "tencache": report["fits"]}
    shown = {name: seconds(value) + ("" if runs[name] else " (does not fit)")
             for name, value in (("stock", stock), ("tencache", tencache))}
    ratio = f" ({tencache / stock:.2f}x)" if all(runs.values()) else ""
    lines.append(f"step time: stock {shown['stock']}, tencache {shown['tencache']}{ratio}; "
                 f"bottleneck: stock {PART_NAMES[report['bottleneck']['stock']]}, tencache "
                 f"{PART_NAMES[report['bottleneck']['tencache']]}")
    parts = list(report["critical_path_s"]["stock"])
    lines.append("critical path (s)  " + "  ".join(f"{PART_NAMES[p]:>10}" for p in parts))
    for name in ("stock", "tencache"):
        lines.append(f"  {name:<16} " + "  ".join(f"{report['critical_path_s'][name][p]:>10.3f}" for p in parts))
    reads, writes = report["nvme_read_bytes_per_step"], report["nvme_write_bytes_per_step"]
    lines.append(f"NVMe per step and rank: stock read {fmt_bytes(reads['stock'])}, written "
                 f"{fmt_bytes(writes['stock'])}; tencache read {fmt_bytes(reads['tencache'])}, written "
                 f"{fmt_bytes(writes['tencache'])}")
    hits = report["hit_rates"]
    lines.append("hit rates (tencache): device " + _percent(hits["device"]) + ", host " + _percent(hits["host"]))
    days = report["drive_days_to_tbw"]
    if report["drive_tbw_bytes"]:
        lines.append(f"drive wear: days of training to each drive's rated {fmt_decimal_tb(report['drive_tbw_bytes'])}"
                     f": stock {_days(days['stock'])}, tencache {_days(days['tencache'])}")
    else:
        lines.append("drive wear: no rated TBW (pass --drive-tbw BYTES, or set drive_tbw_bytes in the machine file)")
    return lines


def _budgets_line(budgets: Dict[str, Any]) -> str:
    """The budgets tencache would choose, as one line; none where nothing is offloaded to NVMe (tencache replaces
    the NVMe swappers only: such a run is stock DeepSpeed's, and ``budgets`` is empty)."""
    if not budgets:
        return "budgets (tencache): none: nothing is offloaded to NVMe, so the run is stock DeepSpeed's"
    start = budgets.get("optimizer_start_share_bytes", budgets["optimizer_share_bytes"])
    start_cache = budgets.get("param_cache_start_bytes", budgets["param_cache_bytes"])
    steady = (budgets["param_cache_bytes"], budgets["optimizer_share_bytes"])
    # the governor gives back from its first reading, a step's rise assumed; it grows once one is measured
    when = "from its first reading, before any step" if sum(steady) < start_cache + start else \
        "once a step's rise is measured"
    changed = "" if steady == (start_cache, start) else (
        f" at start-up; the governor keeps {fmt_bytes(steady[0])} + {fmt_bytes(steady[1])} {when} (a rise of "
        f"{fmt_bytes(budgets['step_rise_bytes'])} assumed)")
    return (f"budgets (tencache): host tier {fmt_bytes(budgets['host_cache_bytes'])} = parameter cache slots "
            f"{fmt_bytes(start_cache)} + optimizer state {fmt_bytes(start)}{changed}"
            f"; streaming slots {fmt_bytes(budgets['param_streaming_bytes'])}; device tier "
            f"{fmt_bytes(budgets['device_cache_bytes'])}")


def _narrow_optimizer(report: Dict[str, Any]) -> str:
    """The masters' and optimizer state's element sizes, where they are not fp32's, and the state tensors where they
    are not Adam's two moments (whose CPU step is priced at CPU Adam's rate all the same) or are by assumption."""
    from ..plan.workload import ADAM_STATE_NAMES
    master, state = report["master_element_bytes"], report["optimizer_state_element_bytes"]
    sizes = "" if (master, state) == (4, 4) else f"; masters {master} B, optimizer state {state} B an element"
    tensors = report["optimizer_state_tensors"]
    if not report["optimizer_state_known"]:
        return sizes + "; optimizer state assumed to be Adam's (an optimizer type the model does not know)"
    return sizes + ("" if tensors == list(ADAM_STATE_NAMES) else
                    f"; optimizer state {' and '.join(tensors)} (its CPU step priced at CPU Adam's rate)")


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _days(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return "never (nothing written)" if value == float("inf") else f"{value:,.0f}"


def _finite(value):
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def run(args) -> int:
    try:
        report = estimate(args)
    except (TencacheConfigError, TencacheResourceError, ValueError) as err:
        print(f"tencache-ds estimate: {err}", file=sys.stderr)
        return 2
    if args.json:  # JSON has no infinity: a drive never written has null days (and 0 bytes written)
        print(json.dumps(_finite(report), indent=2))
    else:
        print("\n".join(render(report)))
    return 0
