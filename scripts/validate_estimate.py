#!/usr/bin/env python
"""Check `tencache-ds estimate` against measured runs: predicted vs measured step time, NVMe bytes per step and
peak host memory, per configuration and arm (stock NVMe, tencache, stock CPU offload), as a Markdown table.

Prospective (the default): calibrate this machine (every probe with the first model, and the compute, ZeRO-3
hook and contention probes again for each other model: their figures are the model's own; or read --machine), write
every prediction to OUT/predictions.json, and only then run `tencache-ds bench` for each configuration
(OUT/<model>-<budget>/); the table compares the saved predictions with those runs. With --recheck, the model's
own probes (compute, ZeRO-3 hooks, the drive beside the layers) run again right before each configuration's bench:
the predictions stay the saved ones, and the table adds each row's error priced with those figures instead
(OUT/rechecks.json has them), which tells the step model's error from the machine's drift since the calibration.

    python scripts/validate_estimate.py --models gpt2-tiny gpt2-small gpt2-medium --budgets auto quarter stream \\
        --out validate-out [--machine configs/machines/this.json] [--steps 6 --warmup 2 --repeats 2] \\
        [--min-measured-s 10]

With --profile-runs, after the calibration each model first trains a few steps under tencache (the "auto" budget,
the device tier off on a host accelerator, on as the benches run it on a GPU) with a profile, and its predictions
take their compute figure from the profile's steady timings, as `tencache-ds estimate --profile` does
(OUT/profile-<model>.json; OUT/machine-<model>-profiled.json).
The calibration's compute probe is a bare forward and backward of the model's layers in a process of its own, whose
ratio to a training step's compute changed with the VM's state (docs/estimate.md, run 19); the profile is a
training step.

Re-priced: price a prospective folder's configurations again with the code in this tree, from the machine files
its calibration wrote and, by default, the profiles its --profile-runs recorded (as the run priced them; "--reprice-from
calibration": from the calibration alone), against the benches it ran. Not prospective: what a change to the step
model would have predicted. The table gives the saved predictions' errors and the re-priced ones.

    python scripts/validate_estimate.py --reprice docs/validate/fp32-2026-12-01-run21-profiled --out repriced

Retrospective: compare with benches already on disk (bench.json folders, e.g. docs/bench/), measured before the
model existed; nothing runs.

    python scripts/validate_estimate.py --from-bench docs/bench/gpt2-*-* --machine configs/machines/this.json \\
        --out validate-retro

The budgets are the bench's: "auto", "quarter" (25% of the bytes the model offloads: bf16 parameters plus 16 bytes
per parameter of optimizer state, the bench pages' 68MB / 560MB / 1600MB) and "stream" (0). gpt2-medium uses
configs/stock-nvme-large-vocab.json (its embedding needs buffer_size 6e7), as docs/benchmarks.md does.
gpt2-1.3b (beyond this machine's RAM) uses configs/stock-nvme-beyond-ram.json, as scripts/bench_beyond_ram.sh does;
run it without --compare-cpu (stock CPU offload is killed for memory) and with that script's shape
(--dtype fp32 --micro-batch 1 --seq-len 32 --steps 5 --warmup 3).
"""
import argparse
import dataclasses
import datetime
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tencache_ds.bench.records import glob_records, read_json_record, record_exists  # noqa: E402
from tencache_ds.bench.report import STAGE3_FETCH_KNOBS  # noqa: E402
from tencache_ds.cli.bench import with_dtype  # noqa: E402
from tencache_ds.cli.calibrate import (MODEL_PROBES, calibrate, machine_from_calibration,  # noqa: E402
                                       model_probe_figures)
from tencache_ds.plan.machine import load_machine  # noqa: E402
from tencache_ds.plan.model_shapes import model_shape  # noqa: E402
from tencache_ds.plan.profile_timings import machine_from_profile  # noqa: E402
from tencache_ds.plan.step_model import STOCK, TENCACHE, predict  # noqa: E402
from tencache_ds.plan.workload import ZeroSettings, build_workload  # noqa: E402
from tencache_ds.profile.steady import STEADY_STEPS  # noqa: E402
from tencache_ds.profile.store import read_sections  # noqa: E402

QUARTER_BYTES = {"gpt2-tiny": "68MB", "gpt2-small": "560MB", "gpt2-medium": "1600MB"}
DEFAULT_CONFIG = "configs/stock-nvme.json"
CONFIG_FOR = {"gpt2-medium": "configs/stock-nvme-large-vocab.json",
              "gpt2-1.3b": "configs/stock-nvme-beyond-ram.json"}  # as scripts/bench_beyond_ram.sh (no --compare-cpu)
ARMS = ("stock", "tencache", "stock-cpu")
# the params profile's recorded step is the run's first; stage 3's second differs from it, and its third repeats the
# second, which replaces it (profile/lifecycle.py); the repeats its steady timings summarise come after
PROFILE_RUN_STEPS = 3 + STEADY_STEPS
# the profile run's tencache block (and its profile_path): on a host accelerator the device tier off, on a GPU as
# the benches run it; profile_run_block says why
PROFILE_RUN_BLOCK = {"enabled": True, "host_cache_bytes": "auto"}


def profile_run_block(machine) -> dict:
    """The tencache block of a ``profiled_machine`` run on ``machine``. On a host accelerator the device tier is off:
    it serves every access after the first step there, and the host store's profile would see no step repeat it.
    On a GPU it is on, as every bench runs it: the optimizer step makes the tier's copies stale, so each step
    fetches every partition once and the profile's steps repeat; with it off, each use of a partition is a gather
    of its own, and the first GPU run (docs/estimate.md, "On a GPU") timed that profile's step 0.288 s where the
    "auto" bench's, tier on, took 0.243 s: its compute priced tencache's step 16% over."""
    return dict(PROFILE_RUN_BLOCK, device_cache_bytes=0) if machine.accelerator_is_host else dict(PROFILE_RUN_BLOCK)


def budget_value(model: str, budget: str):
    if budget == "auto":
        return "auto"
    if budget == "stream":
        return 0
    if budget == "quarter":
        if model in QUARTER_BYTES:
            return QUARTER_BYTES[model]
        shape = model_shape(read_json(os.path.join(REPO, "configs", "models", f"{model}.json")))
        return int(0.25 * shape.num_params * (2 + 16))
    return budget  # a byte size as given


def read_json(path):
    """A JSON file, or a record archived beside its name (docs/ keeps result files and bench.json so)."""
    return read_json_record(path)


def cpu_offload(ds_config: dict) -> dict:
    """The bench's stock-cpu arm: the same config with both offload devices cpu and DeepSpeed's default stage-3
    fetch knobs (scripts/train.py --offload-device cpu --stage3-defaults)."""
    config = json.loads(json.dumps(ds_config))
    for key in STAGE3_FETCH_KNOBS:
        config["zero_optimization"].pop(key, None)
    for section in ("offload_param", "offload_optimizer"):
        block = config["zero_optimization"].get(section)
        if isinstance(block, dict) and block.get("device") in ("cpu", "nvme"):
            block["device"] = "cpu"
            for key in ("nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pipeline_read", "pipeline_write"):
                block.pop(key, None)
    return config


def predict_configuration(machine, model: str, config_path: str, host_cache, micro_batch: int, seq_len: int,
                          compare_cpu: bool, dtype=None, gas=None, stock_cpu_config=None) -> dict:
    """Predictions for one bench: {arm: {step_time_s, nvme_read_bytes, nvme_write_bytes, host_bytes, ...}}, one
    rank's. ``gas``: as the bench ran it (scripts/train.py --grad-accum), else the config's; ``stock_cpu_config``:
    the DeepSpeed config the bench's stock CPU offload arm ran with, as its result recorded it, else the one the
    bench gives that arm now (``cpu_offload``)."""
    shape = model_shape(read_json(os.path.join(REPO, "configs", "models", f"{model}.json")))
    ds_config = with_dtype(read_json(os.path.join(REPO, config_path)), dtype)
    tencache = dict(ds_config, tencache={"enabled": True, "host_cache_bytes": host_cache,
                                         "device_cache_bytes": "auto"})
    gas = gas or int(ds_config.get("gradient_accumulation_steps", 1))

    def run(config, policy):
        work = build_workload(shape, ZeroSettings.from_ds_config(config), machine.world_size, micro_batch, seq_len,
                              gas, False)
        prediction = predict(work, machine)[policy]
        return {"step_time_s": prediction.step_time_s, "nvme_read_bytes": prediction.nvme_read_bytes,
                "nvme_write_bytes": prediction.nvme_write_bytes, "host_bytes": prediction.host_bytes,
                "critical_path_s": prediction.critical_path_s, "bottleneck": prediction.bottleneck}

    out = {"stock": run(ds_config, STOCK), "tencache": run(tencache, TENCACHE)}
    if compare_cpu:
        out["stock-cpu"] = run(stock_cpu_config or cpu_offload(ds_config), STOCK)
    return out


def steps_to_run(steps: int, warmup: int, min_measured_s: float, predicted: dict) -> int:
    """A configuration's ``--steps``: ``steps``, or more where its measured steps (those after ``warmup``) would take
    less than ``min_measured_s`` at the fastest arm's predicted step time (predicted: an arm that runs faster measures
    less). This VM's speed drifts in phases of several seconds (one gpt2-tiny run stepped 0.27-0.33 s for thirteen
    steps and 0.38-0.57 s for eighteen later ones: docs/estimate.md, run 23); five steps of 0.3 s measure one phase.
    Sized from the predictions, made before anything runs, so the run's length does not depend on what it
    measures."""
    fastest = min(arm["step_time_s"] for arm in predicted.values())
    needed = math.ceil(min_measured_s / fastest) if min_measured_s > 0 and fastest > 0 else 0
    return warmup + max(steps - warmup, needed)


def measured_from_bench(folder: str) -> dict:
    """{arm: {step_time_s, nvme_read_bytes, nvme_write_bytes, host_bytes}} from a bench's headline."""
    bench = read_json(os.path.join(folder, "bench.json"))
    rows = {row["name"]: row for row in bench["comparison"]["headline"]}
    out = {}
    for arm in ARMS:
        step = rows["step time (s, median)"].get(arm)
        if step is None:
            continue
        out[arm] = {"step_time_s": step, "nvme_read_bytes": rows["NVMe read / step (median)"].get(arm),
                    "nvme_write_bytes": rows["NVMe written / step (median)"].get(arm),
                    "host_bytes": rows["peak host RSS"].get(arm)}
    recorded = glob_records(folder, "stock-cpu-*.result.json")
    stock_cpu_config = read_json(recorded[0]).get("ds_config") if recorded else None
    return {"settings": bench["settings"], "machine": bench.get("machine", {}), "arms": out,
            "stock_cpu_config": stock_cpu_config}


def arm_rows(name: str, measured: dict, predicted: dict, repriced: dict = None) -> list:
    """The table's rows of one bench: an arm each, its prediction, its measurement and (--recheck, --reprice) its
    price again."""
    return [{"name": name, "arm": arm, "predicted": predicted[arm], "measured": values,
             **({"repriced": repriced[arm]} if repriced is not None else {})}
            for arm, values in measured["arms"].items()]


def error(predicted, measured):
    if predicted is None or measured in (None, 0):
        return None
    return predicted / measured - 1.0


def _shown(value, unit: int, digits: int) -> str:
    """A measured figure in ``unit``; a dash where the run has none (unreadable /proc/self/io), not a false 0."""
    return "–" if value is None else f"{value / unit:.{digits}f}"


def table(rows, repriced_as="step time priced with the figures re-measured before the run") -> str:
    lines = ["| configuration | arm | step time predicted / measured (s) | error | NVMe read / written per step "
             "(MiB): predicted vs measured | peak host memory predicted / measured (GiB) | error |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        p, m = row["predicted"], row["measured"]
        step_error, host_error = error(p["step_time_s"], m["step_time_s"]), error(p["host_bytes"], m["host_bytes"])
        mib = 1 << 20
        lines.append(
            f"| {row['name']} | {row['arm']} | {p['step_time_s']:.3f} / {m['step_time_s']:.3f} | "
            f"{step_error:+.0%} | {p['nvme_read_bytes'] / mib:.1f} / {p['nvme_write_bytes'] / mib:.1f} vs "
            f"{_shown(m['nvme_read_bytes'], mib, 1)} / {_shown(m['nvme_write_bytes'], mib, 1)} | "
            f"{p['host_bytes'] / (1 << 30):.2f} / {_shown(m['host_bytes'], 1 << 30, 2)} | "
            + (f"{host_error:+.0%}" if host_error is not None else "–") + " |")
    within = [row for row in rows if abs(error(row["predicted"]["step_time_s"], row["measured"]["step_time_s"]))
              <= 0.15]
    lines.append("")
    lines.append(f"Step time within 15%: {len(within)} of {len(rows)}.")
    repriced = [row for row in rows if "repriced" in row]
    if repriced:  # --recheck or --reprice: the same rows priced again (``repriced_as`` says with what)
        lines += ["", f"| configuration | arm | {repriced_as} / measured (s) | error |", "| --- | --- | ---: | ---: |"]
        for row in repriced:
            again, measured = row["repriced"]["step_time_s"], row["measured"]["step_time_s"]
            lines.append(f"| {row['name']} | {row['arm']} | {again:.3f} / {measured:.3f} | "
                         f"{error(again, measured):+.0%} |")
        within = [row for row in repriced if abs(error(row["repriced"]["step_time_s"],
                                                       row["measured"]["step_time_s"])) <= 0.15]
        lines += ["", f"Re-priced, within 15%: {len(within)} of {len(repriced)}."]
    return "\n".join(lines)


def with_model_probes(machine, found: dict):
    """``machine`` with the figures MODEL_PROBES measure replaced by ``found`` (a calibrate() result of those
    probes); the rest (the drive, the memory available) as calibrated."""
    return dataclasses.replace(machine, **model_probe_figures(found, default=machine))


def profiled_machine(args, model: str, machine):
    """``machine`` with the figures of a short tencache run of this model's bench shape (``PROFILE_RUN_STEPS``,
    the "auto" budget, its profile's steady timings; plan/profile_timings.machine_from_profile), and the notes on
    what was taken. Its tencache block is ``profile_run_block``'s."""
    config_path = args.config or CONFIG_FOR.get(model, DEFAULT_CONFIG)
    profile = os.path.abspath(profile_path(args.out, model))
    if os.path.exists(profile):  # a profile of an earlier run would be loaded, and this run's steps time it
        os.unlink(profile)
    block = dict(profile_run_block(machine), profile_path=profile)
    # its own swap folder under --nvme-path, removed after it, as the bench does for each of its runs: a training
    # run leaves its swap files (stock does too), 1.6 GB for gpt2-medium's parameters
    nvme_dir = os.path.join(os.path.abspath(args.nvme_path), f"profile-{model}")
    command = [sys.executable, "scripts/train.py", "--deepspeed_config", config_path, "--model", model,
               "--steps", str(PROFILE_RUN_STEPS), "--micro-batch", str(args.micro_batch), "--seq-len",
               str(args.seq_len), "--nvme-path", nvme_dir, "--weights-gather", "none", "--tencache-block",
               json.dumps(block), "--result-file", os.path.join(os.path.abspath(args.out),
                                                                profile_result_name(model))] \
        + (["--dtype", args.dtype] if args.dtype else [])
    print("profiling:", " ".join(command), flush=True)
    shutil.rmtree(nvme_dir, ignore_errors=True)
    try:
        with open(os.path.join(args.out, f"profile-{model}.log"), "w") as log:
            subprocess.run(command, cwd=REPO, check=True, stdout=log, stderr=subprocess.STDOUT)
    finally:
        shutil.rmtree(nvme_dir, ignore_errors=True)
    return machine_from_saved_profile(machine, model, config_path, args.dtype, args.micro_batch, args.seq_len,
                                      profile)


def machine_from_saved_profile(machine, model: str, config_path: str, dtype, micro_batch: int, seq_len: int,
                               profile: str):
    """``machine`` with the figures of the profile a ``profiled_machine`` run of this shape recorded, and the notes
    on what was taken (plan/profile_timings.machine_from_profile)."""
    shape = model_shape(read_json(os.path.join(REPO, "configs", "models", f"{model}.json")))
    result = os.path.join(os.path.dirname(profile), profile_result_name(model))
    ds_config = dict(with_dtype(read_json(os.path.join(REPO, config_path)), dtype),
                     tencache=profiled_block(machine, result))
    work = build_workload(shape, ZeroSettings.from_ds_config(ds_config), machine.world_size, micro_batch, seq_len,
                          int(ds_config.get("gradient_accumulation_steps", 1)), False)
    return machine_from_profile(machine, work, read_sections(profile), source=os.path.basename(profile))


def calibration_path(out: str, model: str, first: bool) -> str:
    """Where the calibration writes a model's machine file: the first model's (every probe) is machine.json, each
    other's (the model's probes again) machine-<model>.json."""
    return os.path.join(out, "machine.json" if first else f"machine-{model}.json")


def profile_path(out: str, model: str) -> str:
    """Where --profile-runs keeps a model's profile."""
    return os.path.join(out, f"profile-{model}.json")


def profile_result_name(model: str) -> str:
    """The result file of a model's profile run, beside its profile."""
    return f"profile-{model}.result.json"


def profiled_block(machine, result_path: str) -> dict:
    """The tencache block the profile run ran with, as its result file recorded it (the fit prices that run's
    step), less its profile_path; ``profile_run_block(machine)``, said on stderr, where the file or its block is
    missing."""
    recorded = read_json(result_path).get("ds_config", {}).get("tencache") if record_exists(result_path) else None
    if not isinstance(recorded, dict):
        print(f"{result_path}: no tencache block recorded for the profile run; fitting it as "
              f"{json.dumps(profile_run_block(machine))}", file=sys.stderr)
        return profile_run_block(machine)
    return {key: value for key, value in recorded.items() if key != "profile_path"}


def reprice(folder: str, source: str):
    """The rows of a prospective folder (its predictions.json and bench folders) with each configuration priced
    again by the code in this tree (``arm_rows``: ``predicted`` the saved prediction, ``repriced`` the new one), and
    {model: the machine it was priced on}. The machine is the model's calibration file (or, for a run priced with
    --machine, that file), and, with ``source`` "profiled" where the run took the model's profile (predictions.json
    says so), that profile's figures on it, as ``--profile-runs`` took them. Each bench is priced at its own
    micro-batch, sequence, dtype, gradient accumulation and stock CPU config, as ``--from-bench`` prices one (the
    run used the same values). A configuration whose bench did not finish is left out, with a message."""
    saved = read_json(os.path.join(folder, "predictions.json"))
    machines, used, rows = {}, {}, []
    for name, entry in saved["predictions"].items():
        model, bench = entry["model"], os.path.join(folder, name)
        if not record_exists(os.path.join(bench, "bench.json")):
            print(f"skipped {name}: no bench.json in {bench}", file=sys.stderr)
            continue
        measured = measured_from_bench(bench)
        settings = measured["settings"]
        if model not in machines:
            calibrated = [path for path in (calibration_path(folder, model, first=False),
                                            calibration_path(folder, model, first=True)) if os.path.exists(path)]
            path = calibrated[0] if calibrated else os.path.join(REPO, saved["machines"][model])
            machines[model], used[model] = load_machine(path), os.path.relpath(path, REPO)
            profile = profile_path(folder, model)
            if source == "profiled" and model in saved.get("profiled", {}):
                machines[model], _ = machine_from_saved_profile(machines[model], model, entry["config"],
                                                                settings.get("dtype"), settings["micro_batch"],
                                                                settings["seq_len"], profile)
                used[model] += f" with {os.path.relpath(profile, REPO)}"
        again = predict_configuration(dataclasses.replace(machines[model], ranks_per_node=entry.get("ranks", 1)),
                                      model, entry["config"], entry["host_cache_bytes"], settings["micro_batch"],
                                      settings["seq_len"], "stock-cpu" in measured["arms"], settings.get("dtype"),
                                      settings.get("grad_accum"), measured["stock_cpu_config"])
        rows += arm_rows(name, measured, entry["predicted"], again)
    return rows, used


def get_machine(args):
    """The machine file, or this machine calibrated now: every probe with the first model, and MODEL_PROBES again
    for each other model (their figures are the model's: the rate its own layers and head ran at, the hooks around
    its submodules, what the drive beside its layers costs them). Returns ({model: machine}, {model: path})."""
    if args.machine:
        return {model: load_machine(args.machine) for model in args.models}, \
            {model: args.machine for model in args.models}
    machines, paths = {}, {}
    for model in args.models:
        model_config = read_json(os.path.join(REPO, "configs", "models", f"{model}.json"))
        if not machines:  # the drive probe keeps as many requests in flight as the first config's stores will
            ds_config = read_json(os.path.join(REPO, args.config or CONFIG_FOR.get(model, DEFAULT_CONFIG)))
            measured = calibrate(args.nvme_path, model_config, args.micro_batch, args.seq_len, args.dtype or "bf16",
                                 ds_config=ds_config)
        else:
            measured = dict(measured, **calibrate(args.nvme_path, model_config, args.micro_batch, args.seq_len,
                                                  args.dtype or "bf16", probes=MODEL_PROBES))
        machines[model] = machine_from_calibration(measured)
        paths[model] = calibration_path(args.out, model, first=not paths)
        with open(paths[model], "w") as handle:
            json.dump(machines[model].to_json(), handle, indent=2)
    return machines, paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from-bench", nargs="+", default=None, metavar="BENCH_DIR",
                        help="retrospective: compare with these bench folders instead of running")
    parser.add_argument("--machine", default=None, help="a machine file (default: calibrate this machine now)")
    parser.add_argument("--out", default="validate-out")
    # what a folder's predictions.json and bench folders record, so --reprice refuses them rather than ignore them
    runs = parser.add_argument_group("the configurations to run (not with --reprice)")
    run_flags = [
        runs.add_argument("--models", nargs="+", default=["gpt2-tiny"]),
        runs.add_argument("--budgets", nargs="+", default=["auto", "quarter", "stream"]),
        runs.add_argument("--steps", type=int, default=6),
        runs.add_argument("--warmup", type=int, default=2),
        runs.add_argument("--repeats", type=int, default=2),
        runs.add_argument("--min-measured-s", type=float, default=0.0,
                          help="run each configuration for enough steps that its fastest arm's measured steps "
                               "last at least this long at its predicted step time (more than --steps where those "
                               "are short)"),
        runs.add_argument("--micro-batch", type=int, default=2),
        runs.add_argument("--seq-len", type=int, default=64),
        runs.add_argument("--compare-cpu", action="store_true", help="add the stock CPU offload arm"),
        runs.add_argument("--nvme-path", default="/tmp/tencache-bench-nvme"),
        runs.add_argument("--ranks", type=int, default=1,
                          help="ranks on this machine (the bench's --ranks; they share its cores, memory and drive)"),
        runs.add_argument("--config", default=None,
                          help="the DeepSpeed config of every configuration (default: the model's, CONFIG_FOR)"),
        runs.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                          help="train in this dtype (scripts/train.py --dtype; default: the config's, bf16)"),
    ]
    parser.add_argument("--recheck", action="store_true",
                        help="run the model's probes again before each bench and add the error priced with them")
    parser.add_argument("--profile-runs", action="store_true",
                        help="price each model's compute with the profile of a short tencache run of it")
    parser.add_argument("--reprice", default=None, metavar="FOLDER",
                        help="price a prospective run's folder again with this tree's code (not prospective)")
    parser.add_argument("--reprice-from", choices=["profiled", "calibration"], default="profiled",
                        help="with --reprice: the machine as the run priced it (its profiles), or its calibration")
    args = parser.parse_args(argv)
    if args.min_measured_s < 0:
        parser.error(f"--min-measured-s {args.min_measured_s}: seconds of measured steps, at least 0")
    if args.recheck and (args.from_bench or args.machine):
        parser.error("--recheck compares this machine's calibration with the same probes before each bench: it "
                     "needs the calibration (no --machine) and benches to run (no --from-bench)")
    if args.profile_runs and (args.from_bench or args.recheck or args.ranks != 1):
        parser.error("--profile-runs trains each model at one rank before the predictions of the benches it runs: "
                     "not with --from-bench, --recheck (which re-prices with the calibration's probes) or --ranks")
    if args.from_bench and (args.ranks != 1 or args.config):  # each bench folder records its own
        parser.error("--ranks and --config describe the benches to run; with --from-bench each bench's settings say")
    if args.reprice and (args.from_bench or args.recheck or args.profile_runs or args.machine):
        parser.error("--reprice prices the saved configurations of a prospective folder with its own machine files "
                     "and profiles: not with --from-bench, --recheck, --profile-runs or --machine")
    describes_runs = [action for action in run_flags if getattr(args, action.dest) != action.default]
    if args.reprice and describes_runs:
        parser.error(f"--reprice prices the configurations the folder saved: {describes_runs[0].option_strings[0]} "
                     f"describes runs to make, and is not taken with it")
    if not args.reprice and args.reprice_from != parser.get_default("reprice_from"):
        parser.error("--reprice-from says how --reprice prices a saved folder: it needs --reprice FOLDER")
    if args.reprice and not os.path.exists(os.path.join(args.reprice, "predictions.json")):
        parser.error(f"--reprice {args.reprice}: no predictions.json there (a prospective run's --out folder)")
    if args.reprice and args.reprice_from == "profiled":  # a profile the run priced with, gone since
        missing = [path for path in (profile_path(args.reprice, model) for model in
                                     read_json(os.path.join(args.reprice, "predictions.json")).get("profiled", {}))
                   if not os.path.exists(path)]
        if missing:
            parser.error(f"--reprice {args.reprice}: the run priced with {missing[0]}, which is missing "
                         f"(--reprice-from calibration prices without it)")
    if args.profile_runs and args.machine:  # the profile run trains here, its block follows the file's accelerator
        import torch
        if load_machine(args.machine).accelerator_is_host == torch.cuda.is_available():
            parser.error(f"--profile-runs trains here, and --machine {args.machine} describes "
                         f"{'a host' if torch.cuda.is_available() else 'a GPU'} accelerator where this machine has "
                         f"{'a GPU' if torch.cuda.is_available() else 'none'}: its profile would price another "
                         f"machine's step")
    if args.reprice and os.path.realpath(args.out) == os.path.realpath(args.reprice):
        parser.error("--out is the --reprice folder: its table.md and rows.json are the run's own")
    os.makedirs(args.out, exist_ok=True)
    if args.reprice:
        rows, used = reprice(args.reprice, args.reprice_from)
        machines = "; ".join(f"{model}: {path}" for model, path in used.items())
        return write_table(args.out, rows, f"Re-priced by this tree's code (not prospective), {args.reprice_from}: "
                                           f"{machines}. The first table is the run's own predictions.",
                           repriced_as=f"step time re-priced ({args.reprice_from})")
    if args.from_bench:  # a glob such as docs/bench/gpt2-*-* also matches folders of ad-hoc runs, with no bench
        skipped = [folder for folder in args.from_bench if not record_exists(os.path.join(folder, "bench.json"))]
        for folder in skipped:
            print(f"skipped {folder}: no bench.json", file=sys.stderr)
        args.from_bench = [folder for folder in args.from_bench if folder not in skipped]
        if not args.from_bench:  # (an empty list would run the prospective benches instead)
            parser.error("no --from-bench folder has a bench.json")
    benches = [measured_from_bench(folder) for folder in args.from_bench or ()]
    if benches:  # the models calibrated are the benches'
        args.models = list(dict.fromkeys(bench["settings"]["model"] for bench in benches))
    machines, machine_paths = get_machine(args)
    profiled = {}
    if args.profile_runs:  # before any prediction: these are the figures they are made with
        for model in args.models:
            machines[model], notes = profiled_machine(args, model, machines[model])
            machine_paths[model] = os.path.join(args.out, f"machine-{model}-profiled.json")
            with open(machine_paths[model], "w") as handle:
                json.dump(machines[model].to_json(), handle, indent=2)
            profiled[model] = notes
            print(f"{model}: " + "; ".join(notes), flush=True)
    rows = []
    if args.from_bench:
        for folder, measured in zip(args.from_bench, benches):
            settings = measured["settings"]
            machine = machines[settings["model"]]
            config = settings.get("config") or "configs/stock-nvme.json"
            config = os.path.relpath(config, REPO) if os.path.isabs(config) else config
            host = settings.get("host_cache_bytes") or "auto"
            # "auto" is a share of the memory available when the run started: the bench recorded it
            available = re.search(r"\(([\d.]+) GiB available at start\)", measured["machine"].get("RAM", ""))
            run_machine = machine if available is None else dataclasses.replace(
                machine, host_available_bytes=int(float(available.group(1)) * (1 << 30)))
            # the bench's ranks share this node (its memory, drive and cores); its measured bytes are rank 0's
            run_machine = dataclasses.replace(run_machine, ranks_per_node=int(settings.get("ranks") or 1))
            predicted = predict_configuration(run_machine, settings["model"], config, host, settings["micro_batch"],
                                              settings["seq_len"], "stock-cpu" in measured["arms"],
                                              settings.get("dtype") or args.dtype, settings.get("grad_accum"),
                                              measured["stock_cpu_config"])
            rows += arm_rows(os.path.basename(folder.rstrip("/")), measured, predicted)
    else:
        plan = [(model, budget) for model in args.models for budget in args.budgets]
        predictions = {}
        for model, budget in plan:
            config = args.config or CONFIG_FOR.get(model, DEFAULT_CONFIG)
            ranks_machine = dataclasses.replace(machines[model], ranks_per_node=args.ranks)
            predicted = predict_configuration(ranks_machine, model, config, budget_value(model, budget),
                                              args.micro_batch, args.seq_len, args.compare_cpu, args.dtype)
            predictions[f"{model}-{budget}"] = {
                "model": model, "budget": budget, "config": config, "ranks": args.ranks,
                "host_cache_bytes": budget_value(model, budget),
                "steps": steps_to_run(args.steps, args.warmup, args.min_measured_s, predicted),
                "predicted": predicted}
        with open(os.path.join(args.out, "predictions.json"), "w") as handle:  # before anything runs
            json.dump({"made_at": datetime.datetime.utcnow().isoformat() + "Z", "machines": machine_paths,
                       "profiled": profiled, "predictions": predictions}, handle, indent=2)
        rechecks = {}
        for name, entry in predictions.items():
            out = os.path.join(args.out, name)
            if args.recheck:  # after the predictions were saved: this only re-prices them beside
                model_config = read_json(os.path.join(REPO, "configs", "models", f"{entry['model']}.json"))
                found = calibrate(args.nvme_path, model_config, args.micro_batch, args.seq_len, args.dtype or "bf16",
                                  probes=MODEL_PROBES, ds_config=read_json(os.path.join(REPO, entry["config"])))
                at_run = dataclasses.replace(with_model_probes(machines[entry["model"]], found),
                                             ranks_per_node=entry["ranks"])
                rechecks[name] = {"at": datetime.datetime.utcnow().isoformat() + "Z",
                                  "accelerator_flops_per_s": at_run.accelerator_flops_per_s,
                                  "zero3_module_call_s": at_run.zero3_module_call_s,
                                  "io_contention": at_run.io_contention,
                                  "repriced": predict_configuration(at_run, entry["model"], entry["config"],
                                                                    entry["host_cache_bytes"], args.micro_batch,
                                                                    args.seq_len, args.compare_cpu, args.dtype)}
                with open(os.path.join(args.out, "rechecks.json"), "w") as handle:
                    json.dump(rechecks, handle, indent=2)
            command = [sys.executable, "-m", "tencache_ds.cli.main", "bench", "--model", entry["model"],
                       "--config", entry["config"], "--steps", str(entry["steps"]), "--warmup", str(args.warmup),
                       "--repeats", str(args.repeats), "--micro-batch", str(args.micro_batch), "--seq-len",
                       str(args.seq_len), "--host-cache-bytes", str(entry["host_cache_bytes"]), "--out", out,
                       "--nvme-path", args.nvme_path, "--no-plots"] + (["--compare", "cpu"] if args.compare_cpu
                                                                       else []) \
                + (["--dtype", args.dtype] if args.dtype else []) \
                + (["--ranks", str(args.ranks)] if args.ranks > 1 else [])
            print("running:", " ".join(command), flush=True)
            started = time.time()
            subprocess.run(command, cwd=REPO, check=True)
            print(f"  {time.time() - started:.0f} s", flush=True)
            measured = measured_from_bench(out)
            rows += arm_rows(name, measured, entry["predicted"],
                             rechecks[name]["repriced"] if name in rechecks else None)
    files = ", ".join(f"{model}: {path}" for model, path in machine_paths.items())
    return write_table(args.out, rows, f"Machine: {next(iter(machines.values())).name} ({files}).")


def write_table(out: str, rows: list, heading: str, **table_options) -> int:
    """OUT/table.md (``heading``, then the table) and OUT/rows.json; the table printed."""
    text = table(rows, **table_options)
    with open(os.path.join(out, "table.md"), "w") as handle:
        handle.write(f"{heading}\n\n{text}\n")
    with open(os.path.join(out, "rows.json"), "w") as handle:
        json.dump(rows, handle, indent=2)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
