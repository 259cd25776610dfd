"""`tencache-ds` argument parsing and dispatch. Owns: the subcommands and their options (frozen by
tests/cli/test_cli.py, tests/cli/test_inspect.py). Does not own: what the subcommands do (doctor.py, bench.py,
inspect_profile.py, estimate.py, checkpoint_for_cpu.py, imported only when run, so `--help` stays fast and imports
neither torch nor deepspeed).

    tencache-ds doctor [--nvme-path PATH] [--config ds_config.json] [--ranks N] [--json]
    tencache-ds bench  [--model gpt2-tiny] [--steps 6] [--warmup 2] [--repeats 1] ... [--out bench-out]
    tencache-ds profile show PATH [--first 10] [--json]
    tencache-ds plan PATH [--host-cache-bytes 0] [--read-bandwidth BYTES/S] [--in-flight-bytes N] [--first 10]
                          [--json]
    tencache-ds estimate --model CONFIG.json --ds-config DS.json --machine MACHINE.json|this [--micro-batch N]
                         [--seq N] [--gas N] [--activation-checkpointing] [--drive-tbw BYTES] [--profile PATH]
                         [--json]
    tencache-ds checkpoint-for-cpu TAG_FOLDER

Also runnable as `python -m tencache_ds.cli.main ...`.
"""
import argparse
import shlex
import sys
from typing import List, NoReturn, Optional, Sequence

DOCTOR_HELP = "check this machine for ZeRO-Infinity with tencache_ds (like ds_report); exit 1 on any FAIL"
BENCH_HELP = "train one model under stock ZeRO-Infinity and under tencache_ds and compare them"
PROFILE_HELP = "read a saved execution profile (config \"profile_path\")"
PLAN_HELP = "what a saved profile predicts under given budgets: host-tier residency, prefetch leads, step time"
FOR_CPU_HELP = "make a checkpoint saved with the optimizer on NVMe load with the optimizer on cpu (stock included)"
ESTIMATE_HELP = ("before launch: whether a model fits, its step time under stock ZeRO-Infinity and under tencache, "
                 "and what it costs the drive, from a config.json, a DeepSpeed config and a machine description")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" unless the default is None/False or the help already says what the default is."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _budget(text: str) -> str:
    """'auto' or a byte size ('4GiB', 1073741824); returned as given, validated here so typos fail before a run."""
    if text == "auto":
        return text
    from ..units import parse_bytes
    try:
        parse_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _byte_size(text: str) -> int:
    from ..units import parse_bytes
    try:
        return parse_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


_DRIVE_UNITS = {"TB": 10 ** 12, "PB": 10 ** 15, "TIB": 1 << 40, "PIB": 1 << 50}


def _drive_rating(text: str) -> float:
    """A drive's rated endurance in bytes: "1200TB", "9.1PB" (decimal, as datasheets give them) or any byte size."""
    from ..units import finite
    stripped = text.strip().upper().replace(" ", "")
    for unit, factor in _DRIVE_UNITS.items():
        if stripped.endswith(unit):
            try:
                value = float(stripped[:-len(unit)]) * factor
            except ValueError:
                break
            if not finite(value) or value <= 0:  # float() reads "nan" and "inf"
                raise argparse.ArgumentTypeError(f"a drive rating must be a positive finite number, got {text!r}")
            return value
    value = _byte_size(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a drive rating must be positive, got {text!r}")
    return float(value)


def _bandwidth(text: str) -> float:
    """Bytes per second: a byte size, optionally followed by "/s" ("3GB/s", "2GiB", 2e9)."""
    value = _byte_size(text[:-2] if text.lower().endswith("/s") else text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a bandwidth must be positive, got {text!r}")
    return float(value)


def build_parser() -> argparse.ArgumentParser:
    """The full parser. Defaults of `bench` are the embedded benchmark (about a minute on a 2-core CPU machine)."""
    from .doctor import DEFAULT_NVME_PATH

    parser = argparse.ArgumentParser(
        prog="tencache-ds",
        description="tencache_ds: tensor caching for DeepSpeed ZeRO-3 / ZeRO-Infinity offload.",
        formatter_class=_HelpFormatter)
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    subcommands.required = True

    doctor = subcommands.add_parser(
        "doctor", help=DOCTOR_HELP, description=DOCTOR_HELP + ". One OK/WARN/FAIL line per check.",
        formatter_class=_HelpFormatter)
    doctor.add_argument("--nvme-path", default=None,
                        help="folder for swap files to check (default: nvme_path of --config, else "
                        f"{DEFAULT_NVME_PATH})")
    doctor.add_argument("--config", default=None, metavar="DS_CONFIG_JSON",
                        help="DeepSpeed config whose \"tencache\" block (and nvme_path) to check, and whose "
                        "aio.intra_op_parallelism sets the requests in flight of the \"nvme drive\" measurement; "
                        "default: the block's defaults")
    doctor.add_argument("--ranks", type=_positive_int, default=None,
                        help="ranks the run starts on this node, whose budgets are checked per rank (default: "
                        "LOCAL_WORLD_SIZE, else one per GPU, else 1; `deepspeed --num_gpus 2` runs 2)")
    doctor.add_argument("--json", action="store_true", help="print the checks as a JSON list instead of lines")

    bench = subcommands.add_parser(
        "bench", help=BENCH_HELP,
        description=BENCH_HELP + ". Both runs use the same DeepSpeed config except the top-level \"tencache\" "
        "block; results, logs, bench.json, bench.md and dashboard.png go to --out.",
        epilog="The training script is scripts/train.py next to the package (override with the environment "
        "variable TENCACHE_BENCH_TRAIN_SCRIPT).",
        formatter_class=_HelpFormatter)
    bench.add_argument("--model", default="gpt2-tiny", help="name in configs/models/ (or a HF config JSON path)")
    bench.add_argument("--steps", type=_positive_int, default=6, help="optimizer steps per run, warm-up included")
    bench.add_argument("--warmup", type=_non_negative_int, default=2,
                       help="first steps of each run left out of medians")
    bench.add_argument("--repeats", type=_positive_int, default=1,
                       help="runs per arm, interleaved: stock, tencache, stock, tencache, ...")
    bench.add_argument("--micro-batch", type=_positive_int, default=2, help="train_micro_batch_size_per_gpu")
    bench.add_argument("--grad-accum", type=_positive_int, default=None,
                       help="gradient_accumulation_steps (default: the config's)")
    bench.add_argument("--ranks", type=_positive_int, default=1,
                       help="ranks per run (the deepspeed launcher's --num_gpus; on the CPU accelerator, processes)")
    bench.add_argument("--seq-len", type=_positive_int, default=64, help="tokens per sample")
    bench.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="training dtype")
    bench.add_argument("--offload", choices=["nvme", "cpu"], default="nvme",
                       help="where ZeRO offloads to: picks configs/stock-nvme.json or configs/stock-cpu.json "
                       "(ignored with --config); cpu is refused before any run, since the tencache arm needs "
                       "something offloaded to NVMe (compare with stock CPU offload: --compare cpu)")
    bench.add_argument("--host-cache-bytes", type=_budget, default=None, metavar="auto|N",
                       help="tencache host_cache_bytes (default: the config's \"tencache\" block, else auto)")
    bench.add_argument("--device-cache-bytes", type=_budget, default=None, metavar="auto|N",
                       help="tencache device_cache_bytes (default: the config's \"tencache\" block, else auto)")
    bench.add_argument("--nvme-path", default=DEFAULT_NVME_PATH,
                       help="folder for swap files; each run uses (and empties) its own subfolder")
    bench.add_argument("--config", default=None, metavar="DS_CONFIG_JSON",
                       help="DeepSpeed config for both runs (default: per --offload)")
    bench.add_argument("--out", default="bench-out", help="output folder")
    bench.add_argument("--launcher", choices=["deepspeed", "python"], default="deepspeed",
                       help="start each run with the deepspeed launcher or as a plain python process")
    bench.add_argument("--nvme-bandwidth", type=_bandwidth, default=None, metavar="BYTES_PER_S",
                       help="the rate of --nvme-path for the I/O-compute bound (reads, writes and both at once), "
                       "e.g. 2GB (default: measured there before the runs through tencache's own engine, a few "
                       "seconds, as `tencache-ds doctor`'s \"nvme drive\" line)")
    bench.add_argument("--drive-tbw", type=_drive_rating, default=None, metavar="BYTES",
                       help="the drive's rated endurance, e.g. 600TB: the bench then says how many days of training "
                       "at each arm's measured write rate it lasts (the bytes written per day are reported anyway)")
    bench.add_argument("--no-plots", action="store_true", help="do not draw the figure (dashboard.png)")
    bench.add_argument("--compare", choices=["cpu"], default=None,
                       help="cpu: add a third arm, stock DeepSpeed with offload device cpu and DeepSpeed's default "
                            "stage-3 fetch knobs (stage3_max_live_parameters, _max_reuse_distance, "
                            "_prefetch_bucket_size, _param_persistence_threshold; the rest of the config as given): "
                            "the reference for a machine whose host memory holds the model")

    profile = subcommands.add_parser(
        "profile", help=PROFILE_HELP, description=PROFILE_HELP + ".", formatter_class=_HelpFormatter)
    profile_actions = profile.add_subparsers(dest="profile_action", metavar="ACTION")
    profile_actions.required = True
    show = profile_actions.add_parser(
        "show", help="per section: the access sequence, tensor sizes and the step's timings",
        description="Per section (params, optimizer): the access sequence (accesses, distinct tensors, the first "
        "keys), the histogram of tensor sizes, and the recorded step's timings (step, compute, I/O wait, NVMe reads "
        "and their bandwidth, bytes per step).", formatter_class=_HelpFormatter)
    show.add_argument("path", metavar="PATH", help="the profile file")
    show.add_argument("--first", type=_non_negative_int, default=10, help="keys listed per section")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")

    plan = subcommands.add_parser(
        "plan", help=PLAN_HELP,
        description=PLAN_HELP + ". The host tier is split between sections by NVMe bytes saved per byte held; "
        "within a section the store's policy (Belady over the profile) decides which tensors stay; the reads left "
        "get prefetch leads (accesses ahead) that fit the in-flight budget.", formatter_class=_HelpFormatter)
    plan.add_argument("path", metavar="PATH", help="the profile file")
    plan.add_argument("--host-cache-bytes", type=_byte_size, default=0, metavar="N",
                      help="host tier for params and optimizer state together (e.g. 8GiB)")
    plan.add_argument("--read-bandwidth", type=_bandwidth, default=None, metavar="BYTES/S",
                      help="NVMe read bandwidth, e.g. 3GB/s (default: each section's measured reads)")
    plan.add_argument("--in-flight-bytes", type=_byte_size, default=None, metavar="N",
                      help="buffer bytes for reads issued ahead and not yet used (default: unbounded)")
    plan.add_argument("--first", type=_non_negative_int, default=10, help="keys and leads listed per section")
    plan.add_argument("--json", action="store_true", help="print JSON instead of text")

    estimate = subcommands.add_parser(
        "estimate", help=ESTIMATE_HELP,
        description=ESTIMATE_HELP + ". The step model (docs/estimate.md) replays one rank's step: ZeRO-3's gathers, "
        "gradients and optimizer sub-groups, on the machine's compute, H2D and NVMe channels, under each policy's "
        "rules; tencache's budgets come from the functions it uses at run time.", formatter_class=_HelpFormatter)
    estimate.add_argument("--model", required=True, metavar="CONFIG_JSON",
                          help="a Hugging Face config.json (gpt2, llama, opt, bloom, falcon), or a name in "
                          "configs/models/")
    estimate.add_argument("--ds-config", required=True, metavar="DS_CONFIG_JSON",
                          help="the DeepSpeed config (ZeRO-3; its \"tencache\" block, if any, sets the budgets)")
    estimate.add_argument("--machine", required=True, metavar="MACHINE_JSON|this",
                          help="a machine file (configs/machines/), or `this`: measure this machine (NVMe with "
                          "tencache's engine, CPU Adam, one layer's forward/backward; about a minute)")
    estimate.add_argument("--micro-batch", type=_positive_int, default=None,
                          help="default: train_micro_batch_size_per_gpu of --ds-config, or what DeepSpeed derives "
                          "from its train_batch_size, else 1")
    estimate.add_argument("--seq", type=_positive_int, default=None,
                          help="tokens per sample (default: 2048, or a learned position table's length where shorter)")
    estimate.add_argument("--gas", type=_positive_int, default=None,
                          help="gradient accumulation steps (default: gradient_accumulation_steps of --ds-config, "
                          "or what DeepSpeed derives from its train_batch_size, else 1)")
    estimate.add_argument("--activation-checkpointing", dest="checkpointing", action="store_true",
                          help="the blocks' forward runs again in backward (Hugging Face gradient checkpointing)")
    estimate.add_argument("--drive-tbw", type=_drive_rating, default=None, metavar="BYTES",
                          help="each drive's rated endurance, e.g. 1200TB or 9.1PB (default: drive_tbw_bytes of the "
                          "machine file)")
    estimate.add_argument("--nvme-path", default=None,
                          help=f"with --machine this: the folder whose drive is measured (default: the nvme_path "
                          f"of --ds-config, the optimizer's first, else {DEFAULT_NVME_PATH})")
    estimate.add_argument("--save-machine", default=None, metavar="PATH",
                          help="with --machine this: also write the measured machine file there")
    estimate.add_argument("--profile", default=None, metavar="PROFILE_JSON",
                          help="a saved tencache profile (config \"profile_path\") of this model and config: its "
                          "measured compute time sets the FLOP rate (its reads' rate is reported, not taken)")
    estimate.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    for_cpu = subcommands.add_parser(
        "checkpoint-for-cpu", help=FOR_CPU_HELP,
        description=FOR_CPU_HELP + ". A checkpoint saved under tencache with the optimizer on NVMe keeps Adam's "
        "moments in its swap files (offloaded_tensors/) only; a load with the optimizer on cpu reads the ZeRO files "
        "and stops (\"Cannot copy out of meta tensor\"). This writes the moments into the ZeRO files, in place; the "
        "swap files stay, so the checkpoint still loads with the optimizer on NVMe.", formatter_class=_HelpFormatter)
    for_cpu.add_argument("tag_folder", metavar="TAG_FOLDER", help="the checkpoint's folder: <save_dir>/<tag>")

    subcommands.add_parser(
        "config-reference", help="print the \"tencache\" block's reference (Markdown) from the config model",
        description="Print docs/configuration.md: every key of the \"tencache\" block, its type, default and "
        "meaning, generated from tencache_ds/config.py.", formatter_class=_HelpFormatter)
    return parser


def run(argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` (default: sys.argv[1:]) and run the subcommand. Returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["tencache-ds"] + argv)
    if args.command == "doctor":
        from . import doctor
        return doctor.run(args)
    if args.command == "bench":
        from . import bench
        return bench.run(args)
    if args.command in ("profile", "plan"):
        from . import inspect_profile
        return inspect_profile.show(args) if args.command == "profile" else inspect_profile.plan(args)
    if args.command == "estimate":
        from . import estimate
        return estimate.run(args)
    if args.command == "checkpoint-for-cpu":
        from . import checkpoint_for_cpu
        return checkpoint_for_cpu.run(args)
    if args.command == "config-reference":
        from ..config import config_reference_markdown
        print(config_reference_markdown(), end="")
        return 0
    raise AssertionError(f"unhandled command {args.command!r}")


def main(argv: Optional[List[str]] = None) -> NoReturn:
    """Console-script entry point (`tencache-ds`): runs and exits with the subcommand's exit code."""
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
