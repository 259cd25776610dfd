"""DeepSpeed's own sections as tencache needs them: ZeRO stage 3, something offloaded to NVMe (with a usable
nvme_path), no GPUDirect Storage, no hpZ copies on NVMe, no SuperOffload of an optimizer on NVMe, optimizer state in
the masters' dtype, the "aio" numbers the swappers read (at most 64 I/O threads), and no "tencache" block misplaced
inside a section. Owns: these checks of a raw DeepSpeed config dict, each naming its key and the remedy before
anything is written. Does not own: the block's own keys
(config.py), the checks against the machine (config_checks.py), DeepSpeed's version and the call that runs them
all at initialize (integrations/deepspeed/config_bridge.validate_ds_config).

Plain module: imports neither torch nor DeepSpeed, so `tencache-ds bench` refuses a config here before its stock
arm trains for nothing.
"""
import difflib
from typing import Any, List, Optional, Tuple

from .config import AUTO, CONFIG_KEY, config_of_ds_dict
from .config_checks import check_swap_folder
from .errors import TencacheConfigError
from .plan.workload import MAX_INTRA_OP_PARALLELISM, check_aio_settings, lax_bool, lax_int, optimizer_precision

# DeepSpeed's sections that reject unknown keys (pydantic extra="forbid"), or ignore them ("aio"): a "tencache"
# block there is a misplaced top-level block (deepspeed-integration.md, e).
NESTED_BLOCK_SECTIONS = ("zero_optimization", "zero_optimization.offload_param",
                         "zero_optimization.offload_optimizer", "aio")
OFFLOAD_SECTIONS = ("offload_param", "offload_optimizer")
DISABLE_HINT = 'or set "tencache": {"enabled": false} to run stock DeepSpeed'


# DeepSpeed 0.19.8's keys of its ZeRO sections, fields and their aliases (DeepSpeedZeroConfig,
# DeepSpeedZeroOffloadParamConfig, DeepSpeedZeroOffloadOptimizerConfig; pydantic extra="forbid": any other key stops
# deepspeed.initialize), and the offload devices it takes, as written (an enum: "NVMe" is refused). Pinned here so
# that `tencache-ds estimate` and `doctor` say what DeepSpeed will refuse without importing it (helper-244's review:
# "fits: yes" and "OK config" for a misspelt sub_group_size, priced with DeepSpeed's default);
# tests/test_zero_keys.py checks them against the installed DeepSpeed's models.
ZERO_KEYS = frozenset({
    "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "compute_grad_norm",
    "contiguous_gradients", "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "elastic_checkpoint",
    "enable_sanity_checks", "gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module",
    "legacy_stage1", "load_from_fp32_weights", "log_trace_cache_warnings", "max_live_parameters",
    "max_reuse_distance", "memory_efficient_linear", "model_persistence_threshold", "module_granularity_threshold",
    "offload_optimizer", "offload_param", "overlap_comm", "override_module_apply", "param_persistence_threshold",
    "parameter_alignment", "pipeline_loading_checkpoint", "prefetch_bucket_size", "reduce_bucket_size",
    "reduce_scatter", "round_robin_gradients", "save_muon_momentum_buffer_in_memory", "stage",
    "stage3_allgather_sequential", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_model_persistence_threshold", "stage3_module_granularity_threshold", "stage3_param_persistence_threshold",
    "stage3_prefetch_bucket_size", "stage3_use_all_reduce_for_fetch_params", "sub_group_size",
    "use_all_reduce_for_fetch_params", "use_multi_rank_bucket_allreduce", "zenflow", "zero_hpz_partition_size",
    "zero_quantized_gradients", "zero_quantized_nontrainable_weights", "zero_quantized_weights"})
OFFLOAD_KEYS = {
    "offload_param": frozenset({"buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"}),
    "offload_optimizer": frozenset({"buffer_count", "cpuadam_cores_perc", "device", "fast_init", "nvme_path",
                                    "pin_memory", "pipeline_read", "pipeline_write", "ratio", "super_offload"})}
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def deepspeed_refusal(raw: dict) -> Optional[str]:
    """What ``deepspeed.initialize`` stops on in the ZeRO sections of ``raw``, on any machine, said as one line
    naming the key; None where they pass (or where this does not know: a section's nested models, leaf_module and
    zenflow, are DeepSpeed's to judge). A key DeepSpeed does not know (with the nearest it does), an offload device
    it does not take, and at stage 3 an NVMe offload without nvme_path (stock's swapper stops on joining None;
    tencache refuses it; stages 1 and 2 never read it). A key valued "auto" is dropped by DeepSpeed's models, as
    here; a "tencache" block inside a section is ``reject_nested_blocks``'."""
    zero = raw.get("zero_optimization")
    if not isinstance(zero, dict):
        return None
    sections = [("zero_optimization", zero, ZERO_KEYS)] + [
        (f"zero_optimization.{name}", zero[name], OFFLOAD_KEYS[name]) for name in OFFLOAD_SECTIONS
        if isinstance(zero.get(name), dict)]
    for where, section, known in sections:
        given = {key: value for key, value in section.items() if value != AUTO}  # (DeepSpeedConfigModel's own drop)
        for key in given:
            if key not in known and key != CONFIG_KEY:
                nearest = difflib.get_close_matches(key, sorted(known), n=1)
                return (f"{where}.{key} is not a key of DeepSpeed's" + (f" (did you mean {nearest[0]}?)" if nearest
                                                                         else "") + ": DeepSpeed refuses the config")
        if where == "zero_optimization":
            continue
        device = given.get("device", "none")
        if device not in OFFLOAD_DEVICES:
            return f"{where}.device is {device!r}: DeepSpeed takes one of {', '.join(map(repr, OFFLOAD_DEVICES))}"
        if device == "nvme" and given.get("nvme_path") is None and lax_int(zero.get("stage", 0)) == 3:
            return f"{where}.nvme_path is missing: an offload to NVMe needs the folder its swap files go in"
    return None


def check_zero_sections(raw: dict) -> List[Tuple[str, dict]]:
    """Every check of DeepSpeed's sections that an enabled block needs (the module docstring; a block misplaced
    inside one is ``reject_nested_blocks``', which preflight.py runs first), in the order a user would fix them.
    Returns the offload sections on NVMe, as (dotted key, section)."""
    nvme_sections = check_zero_sections_but_folders(raw)
    for key, section in nvme_sections:
        check_swap_folder(f"{key}.nvme_path", section.get("nvme_path"))
    return nvme_sections


def check_zero_sections_but_folders(raw: dict) -> List[Tuple[str, dict]]:
    """``check_zero_sections`` but the swap folders' (which may be on another machine: `tencache-ds estimate`
    prices a config for one)."""
    zero = raw.get("zero_optimization")
    zero = zero if isinstance(zero, dict) else {"stage": _legacy_stage(zero)}
    _check_stage(zero.get("stage", 0))
    nvme_sections = _nvme_offload_sections(zero)
    check_aio_settings(raw.get("aio"))
    aio = raw.get("aio") if isinstance(raw.get("aio"), dict) else {}
    threads = aio.get("intra_op_parallelism", 1)
    if threads > MAX_INTRA_OP_PARALLELISM:  # tencache's limit, not DeepSpeed's: a refusal of its arm alone
        raise TencacheConfigError(f"aio.intra_op_parallelism is {threads!r}, more than tencache's "
                                  f"{MAX_INTRA_OP_PARALLELISM} I/O threads per swapper (its checkpoints' swap files "
                                  f"are padded for at most that many): set it to {MAX_INTRA_OP_PARALLELISM} or less")
    if aio.get("use_gds"):
        raise TencacheConfigError(f'aio.use_gds: true puts swap buffers in GPU memory, which tencache does not '
                                  f'manage: remove it, {DISABLE_HINT}')
    _check_secondary_partitions(zero, nvme_sections)
    _check_device_tier(raw, nvme_sections)
    _check_super_offload(nvme_sections)
    _check_optimizer_state_dtype(raw, nvme_sections)
    return nvme_sections


def _nearly_the_block(letters: str) -> bool:
    """``letters`` (a key's, lower case) spell the block's name, with "ds" after it, or with one letter typed
    wrong, left out, added, or two swapped ("tencahce", "tencach": helper-225). No DeepSpeed key comes that near;
    two edits took in "memcache", "tcache" and "no_tencache" (helper-228)."""
    if letters in (CONFIG_KEY, CONFIG_KEY + "ds"):
        return True
    return abs(len(letters) - len(CONFIG_KEY)) <= 1 and _edits(letters, CONFIG_KEY) <= 1


def _edits(a: str, b: str) -> int:
    """Letters changed, left out, added, or two side by side swapped, to turn ``a`` into ``b``."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(rows[i - 1][j] + 1, row[j - 1] + 1, rows[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[i - 2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def reject_nested_blocks(raw: dict) -> None:
    """A "tencache" block inside one of DeepSpeed's sections (NESTED_BLOCK_SECTIONS) is refused, naming where it is
    (whether or not a top-level block exists or is enabled: there it is no block at all); so is a top-level key
    spelled nearly as the block ("tencache_ds", "TenCache", "ten-cache": DeepSpeed ignores it, and the run was
    stock: helper-161's review)."""
    for key in raw:  # (not "_tencache", "//tencache", "tencache_", "tencache2": ways of switching the block off)
        if isinstance(key, str) and key != CONFIG_KEY and key[:1].isalpha() and key[-1:].isalpha() and \
                _nearly_the_block("".join(filter(str.isalpha, key.lower()))):
            raise TencacheConfigError(
                f'{key}: the block is spelled "{CONFIG_KEY}" (DeepSpeed ignores "{key}", and the run would be stock '
                f'DeepSpeed): rename it')
    for dotted in NESTED_BLOCK_SECTIONS:
        section = raw
        for part in dotted.split("."):
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict) and CONFIG_KEY in section:
            ignored = " (DeepSpeed would silently ignore it there)" if dotted == "aio" else ""
            raise TencacheConfigError(
                f'{dotted}.{CONFIG_KEY}: the "{CONFIG_KEY}" block belongs at the top level of the DeepSpeed '
                f'config, beside "zero_optimization", not inside "{dotted.split(".")[-1]}"{ignored}: move it up')


def _legacy_stage(value: Any) -> Any:
    # DeepSpeed still reads "zero_optimization": true/false as stage 1/0 (read_zero_config_deprecated).
    if isinstance(value, bool):
        return int(value)
    return 0 if value is None else value


def _check_stage(stage: Any) -> None:
    try:
        number = int(stage)
    except (TypeError, ValueError):
        number = None
    if number != 3:
        raise TencacheConfigError(
            f'zero_optimization.stage: tencache needs ZeRO stage 3 (got {stage!r}): it replaces the swappers that '
            f'only ZeRO-3 offload uses; set "stage": 3, {DISABLE_HINT}')


def _nvme_offload_sections(zero: dict) -> List[Tuple[str, dict]]:
    """The offload sections that put tensors on NVMe, as (dotted key, section); at least one is required."""
    found, devices = [], []
    for name in OFFLOAD_SECTIONS:
        section = zero.get(name)
        device = section.get("device", "none") if isinstance(section, dict) else "none"
        device = str(getattr(device, "value", device))  # OffloadDeviceEnum in a dict built from DeepSpeed's models
        devices.append(f"{name}.device = {device!r}" if isinstance(section, dict) else f"no {name}")
        if device == "nvme":
            found.append((f"zero_optimization.{name}", section))
    if not found:
        raise TencacheConfigError(
            f'zero_optimization.offload_param.device / zero_optimization.offload_optimizer.device: tencache is '
            f'enabled but nothing is offloaded to NVMe ({", ".join(devices)}), so it would have nothing to do and '
            f'the run would silently be stock DeepSpeed; set "device": "nvme" and "nvme_path" in one of them, '
            f'{DISABLE_HINT}')
    return found


def _check_secondary_partitions(zero: dict, nvme_sections: List[Tuple[str, dict]]) -> None:
    if any(key == "zero_optimization.offload_param" for key, _section in nvme_sections):
        refusal = secondary_partitions_on_nvme(zero)
        if refusal is not None:
            raise TencacheConfigError(refusal)


def secondary_partitions_on_nvme(zero: dict) -> Optional[str]:
    """ZeRO++'s hierarchical partitioning (hpZ) keeps a secondary copy of each parameter partition on the
    parameters' offload device, and stage 3 (DeepSpeed 0.19.8, ``_partition_param_sec``) allocates it there with
    ``torch.empty(device=...)``: with parameters on NVMe that is ``device="nvme"``, and zero.Init stops with
    "Expected one of cpu, cuda, ... device type at start of device string: nvme", stock's swappers and tencache's
    alike. Why, naming both keys (said before anything is partitioned), or None where the ``zero_optimization``
    section ``zero`` asks for no such copies."""
    section = zero.get("offload_param")
    device = section.get("device", "none") if isinstance(section, dict) else "none"
    if str(getattr(device, "value", device)) != "nvme":
        return None
    try:
        hpz = int(zero.get("zero_hpz_partition_size", 1) or 1)
    except (TypeError, ValueError):
        return None  # DeepSpeed's own config model reports a value that is not a number
    if hpz <= 1:
        return None
    return (f"zero_optimization.zero_hpz_partition_size: {hpz} (ZeRO++ hpZ) keeps a secondary copy of every "
            f'parameter partition on the offload_param device, which DeepSpeed cannot allocate on "nvme" '
            f'(zero_optimization.offload_param.device): set zero_hpz_partition_size to 1, or offload the '
            f'parameters to "cpu" (the optimizer state can stay on NVMe)')


def _check_device_tier(raw: dict, nvme_sections: List[Tuple[str, dict]]) -> None:
    """A device tier asked for in bytes needs the parameters on NVMe: it keeps what tencache's parameter swapper
    gathers, and there is none otherwise (coordinator.py). It was ignored without a word (helper-225)."""
    asked = (raw.get(CONFIG_KEY) or {}).get("device_cache_bytes") if isinstance(raw.get(CONFIG_KEY), dict) else None
    if asked is None or config_of_ds_dict(raw).device_cache_bytes in (AUTO, 0):
        return
    if not any(key == "zero_optimization.offload_param" for key, _section in nvme_sections):
        raise TencacheConfigError(
            f"{CONFIG_KEY}.device_cache_bytes {asked!r}: the device tier keeps the parameters tencache reads from "
            'NVMe, and zero_optimization.offload_param.device is not "nvme" here: there is no tier to size. Remove '
            'the key (or set it to 0), or put the parameters on NVMe')


def _check_super_offload(nvme_sections: List[Tuple[str, dict]]) -> None:
    """SuperOffload (``offload_optimizer.super_offload``) builds DeepSpeed's SuperOffloadOptimizer_Stage3, whose
    ``partition_grads`` copies each gradient into its sub-group's fp32 ``.grad`` without swapping it in: with the
    optimizer on NVMe that gradient is None once the sub-group was swapped out, and the first accumulation boundary
    stops with AttributeError mid-backward, stock's swapper and tencache's alike (helper-206)."""
    for key, section in nvme_sections:
        if key == "zero_optimization.offload_optimizer" and lax_bool(section.get("super_offload", False)):
            raise TencacheConfigError(
                f"{key}.super_offload: SuperOffload steps the optimizer from fp32 gradients it never swaps in, so "
                f'it cannot keep the optimizer state on NVMe ({key}.device "nvme"): set super_offload to false, or '
                f'offload the optimizer to "cpu" (the parameters can stay on NVMe)')


def optimizer_state_dtype_message(master_key: str, optimizer: str, remedy: str) -> str:
    """Why a run whose optimizer keeps fp32 state beside narrower masters (``master_key``: the config key that made
    them so) is refused, and ``remedy``: what to set instead."""
    masters = master_key.rsplit(".", 1)[-1][:4]  # bf16 / fp16
    return (f"{master_key}: the masters are {masters} but {optimizer} keeps its state in fp32 "
            f"(fp32_optimizer_states), and tencache's optimizer tier stores a sub-group's tensors in one dtype (the "
            f"state would be narrowed to {masters}: other results than stock CPU offload's); {remedy}, or set "
            f'zero_optimization.offload_optimizer.device to "cpu", {DISABLE_HINT}')


def _check_optimizer_state_dtype(raw: dict, nvme_sections: List[Tuple[str, dict]]) -> None:
    """With the optimizer on NVMe, masters narrower than fp32 and the optimizer DeepSpeed builds from the config
    keeping its state in fp32 (its default): refused here, before anything is partitioned (optimizer_swapper.py says
    why; it checks a client optimizer itself when stage 3 builds its swapper). Stage 3 reads the masters' keys
    whatever "enabled" says."""
    if not any(key == "zero_optimization.offload_optimizer" for key, _section in nvme_sections):
        return
    precision = optimizer_precision(raw)
    if precision.mixed and precision.from_config:  # a client optimizer is checked when stage 3 builds the swapper
        raise TencacheConfigError(optimizer_state_dtype_message(
            precision.master_key, f'the optimizer ("{raw["optimizer"]["type"]}", built as DeepSpeedCPUAdam)',
            precision.remedy))
