#!/usr/bin/env python
"""Train a decoder-only Hugging Face model with DeepSpeed ZeRO-3 on synthetic tokens and record what happened.

A plain DeepSpeed training script, used by hand and by the comparison harness (stock DeepSpeed against the
tencache_ds plugin). Runs are deterministic: the same arguments give the same weights, batches and losses, so two
result files can be compared bit for bit.

    deepspeed --num_gpus 1 scripts/train.py --deepspeed_config configs/stock-nvme.json --model gpt2-tiny --steps 3
    python scripts/train.py --deepspeed_config configs/tencache-auto.json --model gpt2-tiny --result-file out.json
    python scripts/train.py --list-models          # parameter counts of configs/models/*.json (meta device)

Flow: parse args -> load ds_config and apply CLI overrides -> import tencache_ds (not with --untouched-stock)
-> seed -> build the model (--init zero|hf|convert) -> deepspeed.initialize -> per optimizer step: grad_accum micro
steps of forward/backward/step, record loss (and its fp32 bit pattern), time, peak RSS, /proc/self/io deltas and
tencache_ds.stats(engine) -> gather the fp32 master weights (SHA-256, optionally saved) -> write the result JSON on
rank 0. See scripts/README.md.
"""
import argparse
import contextlib
import copy
import functools
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(REPO_ROOT, "configs", "models")
if REPO_ROOT not in sys.path:  # so `import tencache_ds` works from a checkout without `pip install -e .`
    sys.path.insert(0, REPO_ROOT)


def ask_cpuinfo_once():
    """DeepSpeed's op builders ask py-cpuinfo about the CPU each time they load an op (cpu_arch and simd_width for
    async_io, cpu_adam and, on the CPU accelerator, shm_comm): about 1.2 s a question, since py-cpuinfo starts a
    subprocess, 5 to 7 s for every training process. The CPU does not change while the process runs: answer the
    later questions from the first. Stock and tencache runs alike; only start-up is faster."""
    try:
        import cpuinfo
    except ImportError:  # DeepSpeed falls back to lscpu then
        return
    if not hasattr(cpuinfo.get_cpu_info, "cache_info"):
        cpuinfo.get_cpu_info = functools.lru_cache(maxsize=1)(cpuinfo.get_cpu_info)


ask_cpuinfo_once()  # before deepspeed is imported, so every op load finds the cached answer
import torch  # noqa: E402
import deepspeed  # noqa: E402
import shm_buffers  # noqa: E402  (beside this script)
from proc_io import io_delta, read_proc_io  # noqa: E402  (beside this script)

tencache_ds = None  # the plugin, once main() imported it (every run but --untouched-stock)


def import_plugin():
    """``import tencache_ds``: it puts its swappers into DeepSpeed (imported above), which hand back DeepSpeed's own
    for a config without an enabled "tencache" block. Done before anything else touches DeepSpeed."""
    global tencache_ds
    import tencache_ds as plugin
    tencache_ds = plugin


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------
# the keys of an offload section that only NVMe offload reads (stock CPU offload refuses some of them)
NVME_ONLY_OFFLOAD_KEYS = ("nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pipeline_read", "pipeline_write")


def _set_offload_device(block: dict, device: str) -> None:
    block["device"] = device
    if device == "cpu":
        for key in NVME_ONLY_OFFLOAD_KEYS:
            block.pop(key, None)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return value


def _tencache_block(text: str) -> str:
    """--tencache-block: "none", or a JSON object (checked here: a typo stopped the run with a bare JSONDecodeError
    that named no flag, helper-186)."""
    if text.strip().lower() != "none":
        try:
            block = json.loads(text)
        except json.JSONDecodeError as err:
            raise argparse.ArgumentTypeError(f"not JSON ({err}): {text!r}") from None
        if not isinstance(block, dict):
            raise argparse.ArgumentTypeError(f'a JSON object ({{"host_cache_bytes": "auto"}}) or "none", got {text!r}')
    return text


def parse_args(argv=None):
    """The command line (also accepts the --local_rank the DeepSpeed launcher appends)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--deepspeed_config", "--deepspeed-config", dest="ds_config_path",
                   help="ds_config JSON file (e.g. configs/stock-nvme.json)")
    p.add_argument("--model", default="gpt2-tiny", help="name in configs/models/ or a path to a HF config JSON")
    p.add_argument("--steps", type=_positive_int, default=6, help="optimizer steps")
    p.add_argument("--micro-batch", type=_positive_int, default=None,
                   help="train_micro_batch_size_per_gpu (default: config)")
    p.add_argument("--grad-accum", type=int, default=None, help="gradient_accumulation_steps (default: config)")
    p.add_argument("--seq-len", type=_positive_int, default=64)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="default: what the ds_config says")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--nvme-path", default=None, help="replaces nvme_path in offload_param/offload_optimizer")
    p.add_argument("--init", choices=["zero", "hf", "convert"], default="zero",
                   help="zero: under deepspeed.zero.Init; hf: HfDeepSpeedConfig + from_config; "
                   "convert: plain model converted by deepspeed.initialize")
    p.add_argument("--tencache-block", type=_tencache_block, default=None,
                   help='JSON for the top-level "tencache" key, or "none" to remove it')
    p.add_argument("--untouched-stock", action="store_true",
                   help="stock DeepSpeed in a process that never imports tencache_ds (no stats in the result); "
                        "the config must have no \"tencache\" block (see --tencache-block none)")
    p.add_argument("--result-file", default=None, help="write the result JSON here (rank 0)")
    p.add_argument("--save-weights", action="store_true", help="also torch.save fp32 weights to RESULT.weights.pt")
    p.add_argument("--weights-gather", choices=["public", "grouped", "none"], default="public",
                   help="how to read the fp32 master weights at the end (see fp32_weights); none: no hash")
    p.add_argument("--label", default=None, help="free-form label stored in the result (default: config name)")
    p.add_argument("--offload-device", choices=["cpu", "nvme"], default=None,
                   help="replaces offload_param/offload_optimizer device (cpu: stock CPU offload, same config else)")
    p.add_argument("--optimizer-offload-device", choices=["cpu", "nvme"], default=None,
                   help="replaces the device of offload_optimizer only (after --offload-device)")
    p.add_argument("--param-offload-device", choices=["cpu", "nvme"], default=None,
                   help="replaces the device of offload_param only (after --offload-device)")
    p.add_argument("--max-in-cpu", type=float, default=None,
                   help="offload_param.max_in_cpu: parameter elements stage 3 moves into its own CPU buffer")
    p.add_argument("--reuse-distance", type=float, default=None, help="zero_optimization.stage3_max_reuse_distance")
    p.add_argument("--persistence-threshold", type=float, default=None,
                   help="zero_optimization.stage3_param_persistence_threshold")
    p.add_argument("--stage3-defaults", action="store_true",
                   help="drop the config's stage-3 fetch knobs (reuse distance, live parameters, prefetch bucket, "
                        "persistence threshold): DeepSpeed's defaults, as a stock CPU offload user runs")
    p.add_argument("--sub-group-size", type=float, default=None,
                   help="zero_optimization.sub_group_size: parameter elements per optimizer sub-group")
    p.add_argument("--reduce-bucket-size", type=float, default=None,
                   help="zero_optimization.reduce_bucket_size: gradient elements reduced (and swapped out) at once")
    p.add_argument("--checkpoint-dir", default=None, help="where --save-after and --resume keep the checkpoint")
    p.add_argument("--save-after", type=int, default=None,
                   help="engine.save_checkpoint(checkpoint-dir) after this many optimizer steps, then train on")
    p.add_argument("--resume", action="store_true",
                   help="engine.load_checkpoint(checkpoint-dir) before training; the data stream skips the steps "
                        "the checkpoint has seen")
    p.add_argument("--eval-every", type=int, default=None,
                   help="after every K-th optimizer step, one evaluation forward pass (model.eval(), no_grad) on a "
                        "batch of its own: the access sequence diverges from the training profile")
    p.add_argument("--checkpointing-from-step", type=int, default=None,
                   help="turn on Hugging Face activation checkpointing before this step: the sequence changes mid-run")
    p.add_argument("--kill-after-step", type=int, default=None,
                   help="SIGKILL this process right after that step's optimizer step (0-based), before anything is "
                        "flushed or saved: a crash test")
    p.add_argument("--set-grads-through-api", action="store_true",
                   help="before each update, read every parameter's full gradient and set it back "
                        "(deepspeed.utils.safe_get_full_grad / safe_set_full_grad): same values, written back")
    p.add_argument("--edit-weights-after-step", type=int, default=None, metavar="STEP",
                   help="after that step's update (0-based), halve the fp32 masters of the first half of the trained "
                        "weight matrices through deepspeed.utils.safe_set_full_fp32_param, and the last one's "
                        "parameter inside deepspeed.zero.GatheredParameters(modifier_rank=0), as users edit weights "
                        "between steps")
    p.add_argument("--train-only", default=None, metavar="REGEX",
                   help="freeze every parameter whose name does not match REGEX (e.g. 'ln_|bias': layer norms and "
                        "biases only), as fine-tuning a frozen base model does; only the others reach the optimizer")
    p.add_argument("--trainer-param-groups", action="store_true",
                   help="two optimizer parameter groups as Hugging Face's Trainer makes them: weight decay 0.01 for "
                        "weights, none for biases and layer norms")
    p.add_argument("--list-models", action="store_true", help="print a table of configs/models/* and exit")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.list_models and not args.ds_config_path:
        p.error("--deepspeed_config is required")
    if args.train_only is not None:
        try:
            re.compile(args.train_only)
        except re.error as err:
            p.error(f"--train-only {args.train_only!r} is no regular expression: {err}")
    if args.save_weights and not args.result_file:
        p.error("--save-weights needs --result-file")
    if (args.save_after is not None or args.resume) and not args.checkpoint_dir:
        p.error("--save-after and --resume need --checkpoint-dir")
    if args.save_weights and args.weights_gather == "none":
        p.error("--save-weights needs --weights-gather public|grouped")
    return args


# ----------------------------------------------------------------------------------------------------------------
# Distributed environment
# ----------------------------------------------------------------------------------------------------------------
def free_port():
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_dist_env(local_rank=None):
    """Defaults for a plain `python scripts/train.py` run (one process); the launcher sets these itself."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", str(local_rank if local_rank is not None else 0))
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # Port 0 lets the kernel choose the rendezvous store's port as it binds it; a port picked before (free_port) can
    # be taken by another process in between (a suite run failed so, EADDRINUSE, on 2026-12-01). Not where DeepSpeed
    # makes /dev/shm buffers (LOCAL_SIZE set): their names carry the port, and two runs must not share one.
    os.environ.setdefault("MASTER_PORT", str(free_port()) if shm_buffers.creates_buffers() else "0")


def start_distributed():
    """deepspeed.init_distributed(), then this rank's shared-memory all-reduce buffer unlinked once every rank has
    mapped it (shm_buffers.py): DeepSpeed never removes them, and a run killed later leaves none behind either."""
    deepspeed.init_distributed()
    if shm_buffers.creates_buffers():
        deepspeed.comm.barrier()  # every rank is past the backend's start, so has mapped every other's buffer
        shm_buffers.remove_own_buffer()


def rank():
    return int(os.environ.get("RANK", "0"))


def world_size():
    return int(os.environ.get("WORLD_SIZE", "1"))


def log0(msg):
    if rank() == 0:
        print(msg, flush=True)


# ----------------------------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------------------------
# The stage-3 knobs that decide when parameters are fetched and released. Stock NVMe offload needs some of them set
# to run at all (a reuse distance of 0 keeps it from crashing); a stock CPU offload user keeps DeepSpeed's defaults.
STAGE3_FETCH_KNOBS = ("stage3_max_reuse_distance", "stage3_max_live_parameters", "stage3_prefetch_bucket_size",
                      "stage3_param_persistence_threshold")


def load_ds_config(path, args):
    """The ds_config dict with the CLI overrides applied. Only keys DeepSpeed knows go into its own sections. Read
    by DeepSpeed's own reader (JSON or HJSON), as deepspeed.initialize would read the file."""
    from deepspeed.runtime.tensor_parallel.init_utils import load_ds_config as deepspeeds_reader
    cfg = deepspeeds_reader(path)
    micro = args.micro_batch if args.micro_batch is not None else cfg.get("train_micro_batch_size_per_gpu", 1)
    ga = args.grad_accum if args.grad_accum is not None else cfg.get("gradient_accumulation_steps", 1)
    cfg["train_micro_batch_size_per_gpu"] = micro
    cfg["gradient_accumulation_steps"] = ga
    cfg["train_batch_size"] = micro * ga * world_size()
    if args.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
        cfg.pop("fp16", None)
    elif args.dtype == "fp32":
        cfg.pop("bf16", None)
        cfg.pop("fp16", None)
    if args.nvme_path:
        zero = cfg.get("zero_optimization", {})
        for section in ("offload_param", "offload_optimizer"):
            block = zero.get(section)
            if isinstance(block, dict) and (block.get("device") == "nvme" or "nvme_path" in block):
                block["nvme_path"] = args.nvme_path
    zero = cfg.setdefault("zero_optimization", {})
    if args.offload_device:
        for section in ("offload_param", "offload_optimizer"):
            block = zero.get(section)
            if isinstance(block, dict) and block.get("device") in ("cpu", "nvme"):
                _set_offload_device(block, args.offload_device)
    # one section's device, after --offload-device
    for section, device in (("offload_optimizer", args.optimizer_offload_device),
                            ("offload_param", args.param_offload_device)):
        if device and isinstance(zero.get(section), dict):
            _set_offload_device(zero[section], device)
    if args.max_in_cpu is not None and isinstance(zero.get("offload_param"), dict):
        zero["offload_param"]["max_in_cpu"] = int(args.max_in_cpu)
    if args.stage3_defaults:  # each knob under its stage3_ alias or its field's name, which DeepSpeed takes too
        for key in STAGE3_FETCH_KNOBS:
            zero.pop(key, None)
            zero.pop(key[len("stage3_"):], None)
    if args.reuse_distance is not None:
        zero.pop("max_reuse_distance", None)
        zero["stage3_max_reuse_distance"] = args.reuse_distance
    if args.persistence_threshold is not None:
        zero.pop("param_persistence_threshold", None)
        zero["stage3_param_persistence_threshold"] = args.persistence_threshold
    if args.sub_group_size is not None:
        zero["sub_group_size"] = int(args.sub_group_size)
    if args.reduce_bucket_size is not None:
        zero["reduce_bucket_size"] = int(args.reduce_bucket_size)
    if args.tencache_block is not None:
        if args.tencache_block.strip().lower() == "none":
            cfg.pop("tencache", None)
        else:
            cfg["tencache"] = json.loads(args.tencache_block)
    return cfg


def load_model_config(name):
    """A transformers config from configs/models/<name>.json (or a JSON path). Returns (name, config)."""
    path = name if name.endswith(".json") and os.path.exists(name) else os.path.join(MODELS_DIR, name + ".json")
    if not os.path.exists(path):
        known = sorted(f[:-5] for f in os.listdir(MODELS_DIR) if f.endswith(".json"))
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(known)}")
    with open(path) as fh:
        d = json.load(fh)
    from transformers import AutoConfig
    return os.path.basename(path)[:-5], AutoConfig.for_model(**d)


def max_positions(cfg):
    """The longest sequence the model's position table allows (None: unbounded, e.g. ALiBi/RoPE)."""
    for key in ("n_positions", "max_position_embeddings"):
        if getattr(cfg, key, None):
            return getattr(cfg, key)
    return None


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------
def seed_everything(seed):
    """Seed python, numpy and torch before the model is built so weights are identical between runs."""
    from deepspeed.runtime.utils import set_random_seed
    set_random_seed(seed)
    torch.manual_seed(seed)


def build_model(mode, model_cfg, ds_config):
    """The model, built one of three ways. Returns (model, keepalive); keep `keepalive` until training ends
    (HfDeepSpeedConfig is held by a weak reference inside transformers)."""
    from transformers import AutoModelForCausalLM
    preimport_model_code(model_cfg)
    if mode == "zero":
        with contextlib.ExitStack() as stack:
            for ctx in hf_zero3_build_contexts():
                stack.enter_context(ctx)
            stack.enter_context(deepspeed.zero.Init(config_dict_or_path=ds_config))
            model = AutoModelForCausalLM.from_config(model_cfg)
        hf_init_weights_zero3(model)
        return model, None
    if mode == "hf":
        from transformers.integrations import HfDeepSpeedConfig
        keepalive = HfDeepSpeedConfig(ds_config)  # makes from_config build under zero.Init itself
        return AutoModelForCausalLM.from_config(model_cfg), keepalive
    if mode == "convert":
        return AutoModelForCausalLM.from_config(model_cfg), None  # deepspeed.initialize partitions it
    raise ValueError(mode)


def preimport_model_code(model_cfg):
    """Import the model's modeling module (and torch._dynamo) before zero.Init is entered. transformers imports
    modeling code lazily; importing torch._dynamo while zero.Init has patched tensor construction fails with
    "TypeError: Signature mismatch between ...new_tensor and tensor_pynew"."""
    import torch._dynamo  # noqa: F401
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    return MODEL_FOR_CAUSAL_LM_MAPPING[type(model_cfg)]


def hf_zero3_build_contexts():
    """The contexts transformers itself wraps around zero.Init (--init hf), for use around ours (--init zero):
    skip weight init while params are empty partitions (OPT's padding_idx init would index an empty tensor), and
    keep torch.arange (RoPE inv_freq buffers) out of zero.Init's cast to bf16."""
    contexts = []
    try:
        from transformers.initialization import no_init_weights
        contexts.append(no_init_weights())
    except ImportError:  # transformers < 5
        from transformers.modeling_utils import no_init_weights
        contexts.append(no_init_weights())
    try:
        from transformers.integrations.deepspeed import prevent_arange_dtype_change
        contexts.append(prevent_arange_dtype_change())
    except ImportError:
        pass
    return contexts


def hf_init_weights_zero3(model):
    """Apply the model's own (Hugging Face) weight init to a model built under our zero.Init, as transformers does
    after its own zero.Init: gather each module's params (written back to their partition / NVMe afterwards) and
    run the init on rank 0."""
    try:
        from transformers.integrations.deepspeed import initialize_weights_zero3  # transformers >= 5
    except ImportError:
        initialize_weights_zero3 = None
    if initialize_weights_zero3 is not None:
        initialize_weights_zero3(model)
    else:
        with torch.no_grad(), deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            if rank() == 0:
                model.init_weights()
    model.tie_weights()


def count_params(model):
    """Parameter count; under ZeRO-3 the partitioned params carry their full size in ds_numel."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


# ----------------------------------------------------------------------------------------------------------------
# Measurements
# ----------------------------------------------------------------------------------------------------------------
def cpu_times():
    """CPU time of the training thread and of the whole process, context switches, and the core the training thread
    last ran on: a step slower than its neighbours then shows whether the training thread worked longer, waited, or
    was moved (the GPU leases' runs varied by 0.1 s a step from one run to the next, docs/gpu_check.md)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/stat") as f:
            last_cpu = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39, counted after the name
    except (OSError, ValueError, IndexError):
        last_cpu = -1
    return {"thread_cpu_s": time.thread_time(), "process_cpu_s": time.process_time(),
            "voluntary_switches": usage.ru_nvcsw, "involuntary_switches": usage.ru_nivcsw, "last_cpu": last_cpu}


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # ru_maxrss is KiB on Linux


def compute_environment():
    """What decides a CPU run's floating-point results besides the inputs (kernel ISA, thread count, processor):
    a parity failure prints both runs' so that a difference in these is told from one in the bytes swapped."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "num_threads": torch.get_num_threads(),
            "cpu_model": model, "host": socket.gethostname(),
            "env": {key: os.environ[key] for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR")
                    if key in os.environ}}


def loss_bits(loss):
    """The exact fp32 bit pattern of a loss as '0x%08x'."""
    bits = torch.tensor(loss, dtype=torch.float32).view(torch.int32).item() & 0xFFFFFFFF
    return f"0x{bits:08x}"


def grad_norm_bits(engine):
    """The engine's global gradient norm after its last step, the one clipping divided by, as the hex of its float64
    bits (None where the engine has none yet)."""
    norm = engine.get_global_grad_norm()
    if norm is None:
        return None
    value = norm.item() if torch.is_tensor(norm) else float(norm)
    return struct.pack(">d", value).hex()


def plugin_stats(engine):
    """tencache_ds.stats(engine) if the plugin has that API (a flat dict), else None."""
    fn = getattr(tencache_ds, "stats", None)  # None: --untouched-stock
    if fn is None:
        return None
    try:
        return fn(engine)
    except Exception as err:  # the run's losses are still valid; record the failure instead of dying
        return {"stats_error": f"{type(err).__name__}: {err}"}


def nvme_usage(ds_config):
    """Swap files DeepSpeed/tencache left under each nvme_path: {path: {"files": n, "bytes": b}}."""
    paths = set()
    for section in ("offload_param", "offload_optimizer"):
        block = ds_config.get("zero_optimization", {}).get(section) or {}
        if block.get("device") == "nvme" and block.get("nvme_path"):
            paths.add(block["nvme_path"])
    usage = {}
    for root in sorted(paths):
        files = total = 0
        for dirpath, _, names in os.walk(root):
            for n in names:
                try:
                    total += os.path.getsize(os.path.join(dirpath, n))
                    files += 1
                except OSError:
                    pass
        usage[root] = {"files": files, "bytes": total}
    return usage


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------
def synthetic_batches(vocab, micro, seq_len, seed):
    """An endless stream of (micro, seq_len) token batches from a generator seeded with `seed`."""
    g = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randint(0, vocab, (micro, seq_len), generator=g)


def train_step(engine, batches, grad_accum, set_grads=False):
    """One optimizer step = grad_accum micro steps. Returns the mean fp32 loss (over micro steps and ranks).
    ``set_grads``: before the update, every parameter's full gradient is read and set back through DeepSpeed's
    API (safe_get_full_grad / safe_set_full_grad, as a user editing gradients does): the same values, through
    the optimizer swapper's gradient write-back."""
    losses = []
    for micro_step in range(grad_accum):
        x = next(batches).to(engine.device)
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        if set_grads and micro_step == grad_accum - 1:
            for param in engine.module.parameters():
                deepspeed.utils.safe_set_full_grad(param, deepspeed.utils.safe_get_full_grad(param))
        engine.step()
        losses.append(loss.detach().float().cpu())
    mean = torch.stack(losses).mean()
    if world_size() > 1:  # the loss over all ranks' batches (identity for one rank)
        mean = mean.to(engine.device)
        deepspeed.comm.all_reduce(mean)
        mean = (mean / world_size()).cpu()
    return mean


def edit_weights(engine):
    """--edit-weights-after-step: the fp32 masters of the first half of the trained weight matrices halved through
    DeepSpeed's API (the parameters follow at the next update, from the masters), and the last one's parameter
    halved by rank 0 inside GatheredParameters (ZeRO-3 keeps the master: the next update overwrites the change). In
    fp32 under tencache each leaves sub-groups' masters and parameter partitions apart
    (integrations/deepspeed/master_copies.py); several sub-groups, so that some are not held whole."""
    trained = [param for param in engine.module.parameters()
               if param.requires_grad and len(getattr(param, "ds_shape", param.shape)) == 2]
    for param in trained[:len(trained) // 2]:
        deepspeed.utils.safe_set_full_fp32_param(param, deepspeed.utils.safe_get_full_fp32_param(param) * 0.5)
    last = trained[-1]
    with deepspeed.zero.GatheredParameters(last, modifier_rank=0):
        if rank() == 0:
            with torch.no_grad():
                last.mul_(0.5)


def eval_loss(engine, batches):
    """One evaluation forward pass (no gradients) on the next batch of ``batches``; the model is put back in
    training mode."""
    engine.module.eval()
    with torch.no_grad():
        x = next(batches).to(engine.device)
        loss = engine(input_ids=x, labels=x).loss.float()
    engine.module.train()
    return loss.item()


def run_steps(engine, batches, steps, grad_accum, first_step=0, save_after=None, checkpoint_dir=None,
              eval_every=None, eval_batches=None, checkpointing_from_step=None, kill_after_step=None,
              set_grads=False, edit_weights_after_step=None):
    """The training loop with per-step measurements; saves a checkpoint after ``save_after`` steps if asked, runs
    an evaluation pass after every ``eval_every`` steps, turns activation checkpointing on at
    ``checkpointing_from_step``, and kills the process with SIGKILL right after step ``kill_after_step``'s
    optimizer step if asked; ``set_grads``: see train_step; ``edit_weights_after_step``: edit_weights after that
    step."""
    records = []
    for step in range(first_step, first_step + steps):
        if save_after is not None and step == save_after:
            engine.save_checkpoint(checkpoint_dir, tag="ckpt")
            log0(f"saved checkpoint after step {step} to {checkpoint_dir}")
        if checkpointing_from_step is not None and step == checkpointing_from_step:
            engine.module.gradient_checkpointing_enable()
            log0(f"activation checkpointing on from step {step}")
        io0 = read_proc_io()
        cpu0 = cpu_times()
        t0 = time.perf_counter()
        loss = train_step(engine, batches, grad_accum, set_grads)
        if step == kill_after_step:
            log0(f"step {step} loss {loss.item():.4f}: killing this process (SIGKILL)")
            os.kill(os.getpid(), signal.SIGKILL)
        elapsed = time.perf_counter() - t0
        cpu1 = cpu_times()
        io1 = read_proc_io()
        value = loss.item()
        records.append({
            "step": step,
            "loss": value,
            "loss_bits": loss_bits(value),
            "grad_norm_bits": grad_norm_bits(engine),
            "time_s": elapsed,
            "peak_rss_bytes": peak_rss_bytes(),
            "io_read_bytes": io_delta(io0, io1, "read_bytes"),
            "io_write_bytes": io_delta(io0, io1, "write_bytes"),
            "stats": plugin_stats(engine),
            "cpu": {key: cpu1[key] - cpu0[key] for key in cpu0 if key != "last_cpu"} | {"last_cpu": cpu1["last_cpu"]},
        })
        log0(f"step {step} loss {value:.4f} time {elapsed:.2f}s")
        if eval_every and (step + 1) % eval_every == 0:
            value = eval_loss(engine, eval_batches)
            records[-1]["eval_loss_bits"] = loss_bits(value)
            log0(f"eval after step {step} loss {value:.4f}")
        if step == edit_weights_after_step:  # outside the step's measurements: the next step's start
            edit_weights(engine)
    return records


# ----------------------------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------------------------
def fp32_weights(engine, how="public", spill_parent=None):
    """(name, full fp32 master weight on CPU), in name order, one at a time. With how="public" a caller that hashes
    and drops each one holds a weight or two, not the model (at 2 ranks beyond RAM the whole dict, 5.1 GB a rank,
    ended the run with the OOM killer); "grouped" reads every weight first. Collective: every rank must iterate it to
    the end.

    how="public": deepspeed.utils.safe_get_full_fp32_param(p) per parameter, DeepSpeed's public API. With an
      NVMe-offloaded optimizer every call swaps in (and releases) the parameter's whole optimizer sub-group, so the
      cost is (number of params) x (sub-group bytes): ~6 s for gpt2-tiny, ~2 min for gpt2-small.
    how="grouped": the same reads, hoisted: each optimizer sub-group is swapped in once (through the ZeRO-3
      optimizer's own swap-in/release methods, i.e. through whatever optimizer swapper is installed) and all its
      params are read from it. Same result; falls back to "public" when the optimizer lacks those methods. Where
      the weights are more than a quarter of the memory available, each is kept in a file until its turn
      (``spill_dir``, removed after): gpt2-2.7b's 10.4 GB held at once ended stock's bench run with the OOM killer
      after its last step."""
    named = sorted(engine.module.named_parameters(), key=lambda kv: kv[0])
    grouped = how == "grouped" and _has_grouped_fp32_access(engine.optimizer)
    trained = [(name, p) for name, p in named if p.requires_grad]
    spill_dir = None
    if grouped and 4 * sum(4 * getattr(p, "ds_numel", p.numel()) for _, p in trained) > _available_memory_bytes():
        _drop_stale_spills(spill_parent)
        spill_dir = tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-", dir=spill_parent)
    # grouped: every sub-group's weights at once (the sub-groups' order is not the names')
    try:
        from_groups = _gather_fp32_grouped(engine.optimizer, trained, spill_dir) if grouped else {}
        yield from _in_name_order(named, from_groups, grouped)
    finally:
        if spill_dir is not None:
            shutil.rmtree(spill_dir, ignore_errors=True)


SPILL_PREFIX = "fp32-weights-"  # + the pid of the run that made it


def _drop_stale_spills(parent):
    """Remove the spill folders of runs that are gone (killed before their ``finally``): gpt2-2.7b's are 10.4 GB,
    and a later run on the same drive would meet a full disk."""
    parent = parent or tempfile.gettempdir()
    for name in os.listdir(parent):
        pid = name[len(SPILL_PREFIX):].split("-", 1)[0]
        if not name.startswith(SPILL_PREFIX) or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def _available_memory_bytes():
    with open("/proc/meminfo") as handle:
        fields = dict(line.split(":", 1) for line in handle)
    return int(fields["MemAvailable"].split()[0]) * 1024


def _in_name_order(named, from_groups, grouped):
    from deepspeed.utils import safe_get_full_fp32_param
    for name, p in named:
        full = from_groups.pop(name, None)
        if isinstance(full, str):  # spilled: read back, then dropped by the caller once hashed
            path, full = full, torch.load(full)
            os.remove(path)
        if full is None and p.requires_grad and not grouped:
            full = safe_get_full_fp32_param(p)
            full = None if full is None else full.detach().float().cpu().contiguous()
        if full is None:
            # frozen parameters (--train-only) have no fp32 master: their weights are the parameters themselves
            with deepspeed.zero.GatheredParameters(p, modifier_rank=None):
                full = p.detach().float().cpu().clone()
        yield name, full


_GROUPED_ATTRS = ("grad_position", "get_param_id", "fp32_partitioned_groups_flat", "_swappable_optimizer_subgroup",
                  "_optimizer_states_and_gradient_swap_in", "_release_swap_buffers", "_fp32_state_allgather")


def _has_grouped_fp32_access(optimizer):
    return all(hasattr(optimizer, a) for a in _GROUPED_ATTRS)


def _gather_fp32_grouped(opt, named, spill_dir=None):
    """One swap-in per optimizer sub-group (what DeepSpeedZeroOptimizer_Stage3.get_full_hp_param does per param):
    {name: tensor}, or {name: file} with ``spill_dir``."""
    by_group = {}
    for name, p in named:
        group_idx, offset, numel = opt.grad_position[opt.get_param_id(p)]
        by_group.setdefault(group_idx, []).append((name, p, offset, numel))
    weights = {}
    for group_idx in sorted(by_group):
        swapped = opt._swappable_optimizer_subgroup(group_idx)
        if swapped:
            opt._optimizer_states_and_gradient_swap_in(group_idx)
        flat = opt.fp32_partitioned_groups_flat[group_idx]
        for name, p, offset, numel in by_group[group_idx]:
            weight = opt._fp32_state_allgather(p, flat.narrow(0, offset, numel)).float().cpu().clone()
            if spill_dir is not None:
                path = os.path.join(spill_dir, f"{len(weights)}.pt")
                torch.save(weight, path)
                weight = path
            weights[name] = weight
        if swapped:
            opt._release_swap_buffers(group_idx)
    return weights


def weights_sha256(weights, kept=None):
    """(SHA-256 over the raw bytes of each tensor of ``weights`` ((name, tensor) in name order), concatenated; the
    seconds spent hashing). Each tensor is put in the dict ``kept`` where one is given, else dropped once hashed."""
    h, hashing_s = hashlib.sha256(), 0.0
    for name, tensor in weights:
        started = time.perf_counter()
        h.update(tensor.numpy().tobytes())
        hashing_s += time.perf_counter() - started
        if kept is not None:
            kept[name] = tensor
    return h.hexdigest(), hashing_s


# ----------------------------------------------------------------------------------------------------------------
# Model table (--list-models)
# ----------------------------------------------------------------------------------------------------------------
def list_models():
    """Print a markdown table of configs/models/*.json with parameter counts computed on the meta device."""
    from transformers import AutoModelForCausalLM
    print("| model | model_type | parameters | layers | hidden | heads | vocab | largest tensor | smallest matrix |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for fname in sorted(os.listdir(MODELS_DIR)):
        if not fname.endswith(".json"):
            continue
        name, cfg = load_model_config(fname[:-5])
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        params = list(model.parameters())  # tied weights counted once
        n = sum(p.numel() for p in params)
        largest = max(p.numel() for p in params)
        smallest = min(p.numel() for p in params if p.dim() == 2)
        human = f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"
        print(f"| {name} | {cfg.model_type} | {n:,} ({human}) | {cfg.num_hidden_layers} | {cfg.hidden_size} | "
              f"{cfg.num_attention_heads} | {cfg.vocab_size:,} | {largest:,} | {smallest:,} |")


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------
def write_result(path, result):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1)
    os.replace(tmp, path)


def main(argv=None):
    args = parse_args(argv)
    if args.list_models:
        list_models()
        return 0
    ensure_dist_env(args.local_rank)
    ds_config = load_ds_config(args.ds_config_path, args)
    if args.untouched_stock and "tencache" in ds_config:
        raise SystemExit(f'--untouched-stock: {args.ds_config_path} has a "tencache" block; remove it with '
                         f'--tencache-block none')
    if not args.untouched_stock:
        import_plugin()
    start_distributed()

    recorded_config = copy.deepcopy(ds_config)  # DeepSpeed may edit the dict it is given
    model_name, model_cfg = load_model_config(args.model)
    limit = max_positions(model_cfg)
    if limit is not None and args.seq_len > limit:
        raise SystemExit(f"--seq-len {args.seq_len} exceeds {model_name}'s {limit} positions")

    t_init = time.perf_counter()
    seed_everything(args.seed)
    model, keepalive = build_model(args.init, model_cfg, ds_config)
    if args.train_only is not None:
        for name, param in model.named_parameters():
            param.requires_grad_(re.search(args.train_only, name) is not None)
    trained = [param for param in model.parameters() if param.requires_grad]
    if args.trainer_param_groups:
        no_decay = [param for name, param in model.named_parameters()
                    if param.requires_grad and ("bias" in name or "ln_" in name or "norm" in name)]
        groups = [{"params": [param for param in trained if all(param is not other for other in no_decay)],
                   "weight_decay": 0.01},
                  {"params": no_decay, "weight_decay": 0.0}]
        trained = [group for group in groups if group["params"]]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trained, config=ds_config)
    init_time = time.perf_counter() - t_init
    num_params = count_params(engine.module)
    log0(f"model {model_name} params {num_params:,} init {args.init} ({init_time:.1f}s) "
         f"config {os.path.basename(args.ds_config_path)} tencache={'tencache' in ds_config}")

    batches = synthetic_batches(model_cfg.vocab_size, ds_config["train_micro_batch_size_per_gpu"], args.seq_len,
                                args.seed + rank())  # rank 0 of any world size sees the same batches
    first_step = 0
    if args.resume:
        load_path, client_state = engine.load_checkpoint(args.checkpoint_dir, tag="ckpt")
        if load_path is None:
            raise SystemExit(f"no checkpoint in {args.checkpoint_dir}")
        first_step = engine.global_steps
        for _ in range(first_step * ds_config["gradient_accumulation_steps"]):
            next(batches)  # the same data the uninterrupted run sees next
        log0(f"resumed from {load_path} at step {first_step}")
    eval_batches = synthetic_batches(model_cfg.vocab_size, ds_config["train_micro_batch_size_per_gpu"],
                                     args.seq_len, args.seed + 1000 + rank())
    records = run_steps(engine, batches, args.steps, ds_config["gradient_accumulation_steps"], first_step,
                        args.save_after, args.checkpoint_dir, args.eval_every, eval_batches,
                        args.checkpointing_from_step, args.kill_after_step, args.set_grads_through_api,
                        args.edit_weights_after_step)

    sha, gather_time = None, None
    if args.weights_gather != "none":
        t0 = time.perf_counter()
        kept = {} if rank() == 0 and args.save_weights else None
        # a file kept until its turn goes beside the swap folder, not in it (nvme_usage counts that)
        spill_parent = os.path.dirname(os.path.abspath(args.nvme_path)) if args.nvme_path else None
        sha, hashing_s = weights_sha256(fp32_weights(engine, args.weights_gather, spill_parent), kept)
        gather_time = time.perf_counter() - t0 - hashing_s  # the gather alone, as before the hash was streamed
        log0(f"weights sha256 {sha} ({args.weights_gather}, {gather_time:.1f}s)")
        if kept is not None:
            torch.save(kept, args.result_file + ".weights.pt")
        del kept

    if rank() == 0 and args.result_file:
        write_result(args.result_file, {
            "label": args.label or os.path.splitext(os.path.basename(args.ds_config_path))[0],
            "model": model_name,
            "num_params": num_params,
            "init": args.init,
            "seed": args.seed,
            "seq_len": args.seq_len,
            "world_size": world_size(),
            "ds_config": recorded_config,
            "init_time_s": init_time,
            "steps": records,
            "weights_sha256": sha,
            "weights_gather": args.weights_gather,
            "weights_gather_time_s": gather_time,
            # the plugin's counters once the gather's swap-ins are done too (None without a gather or the plugin)
            "stats_after_weights_gather": plugin_stats(engine) if sha is not None else None,
            "nvme_usage": nvme_usage(recorded_config),
            "torch_version": torch.__version__,
            "deepspeed_version": deepspeed.__version__,
            "tencache_imported": "tencache_ds" in sys.modules,  # False: stock untouched (--untouched-stock)
            "compute": compute_environment(),
        })
    del keepalive
    return 0


if __name__ == "__main__":
    sys.exit(main())
