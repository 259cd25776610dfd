"""What one training step does, from what a user has: a Hugging Face config.json, a DeepSpeed config, micro-batch,
sequence length, gradient accumulation and activation checkpointing. Owns: reading the DeepSpeed settings the step
model depends on (with DeepSpeed 0.19.8's defaults, deepspeed/runtime/zero/{config,offload_config}.py), each
rank's parameter partitions, which of them live on NVMe, the optimizer sub-groups, and the fetch sequence ZeRO-3
issues per micro-step. Does not own: timing or memory (plan/step_model/). Pure.
"""
import dataclasses
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..config import TencacheConfig, config_of_ds_dict
from ..errors import TencacheConfigError
from ..units import finite
from .model_shapes import ModelShape

MIB = 1 << 20
AIO_ALIGNED_BYTES = 1024  # DeepSpeed: swap sizes are multiples of 1024 x intra_op_parallelism bytes


# DeepSpeed's DtypeEnum names for a dtype (runtime/config.py), by element size
_DTYPE_NAME_BYTES = {name: 2 for name in ("torch.float16", "fp16", "float16", "half", "torch.bfloat16", "bf16",
                                          "bfloat16")}
_DTYPE_NAME_BYTES.update({name: 4 for name in ("torch.float32", "fp32", "float32", "float")})


# The strings pydantic's lax bool parsing takes (DeepSpeed parses offload_optimizer with it): a raw JSON config read
# without pydantic must give each the same answer
_TRUE_STRINGS = {"1", "on", "t", "true", "y", "yes"}
_FALSE_STRINGS = {"0", "off", "f", "false", "n", "no"}


def lax_bool(value: Any) -> bool:
    """A DeepSpeed config flag as pydantic reads it (a string too)."""
    if isinstance(value, str) and value.lower() in _TRUE_STRINGS | _FALSE_STRINGS:
        return value.lower() in _TRUE_STRINGS
    return bool(value)  # (another string: DeepSpeed refuses the config)


def lax_int(value: Any) -> Any:
    """A DeepSpeed config integer as pydantic reads it: the string of a whole number too ("3", " 40000000 ",
    "1_000", "3.0"; not "4e7" or another script's digits, which DeepSpeed refuses); anything else as given, for the
    caller to judge."""
    if isinstance(value, str) and re.fullmatch(r"\s*\+?[0-9][0-9_]*(\.0*)?\s*", value, re.ASCII):
        return int(value.strip().lstrip("+").split(".")[0].replace("_", ""))
    return value


def stage3_key(zero: Mapping[str, Any], field: str) -> str:
    """The key ``zero_optimization`` gives a stage-3 knob under: DeepSpeed's models take the field's name
    (``max_reuse_distance``) as well as its ``stage3_`` alias, the alias first (helper-245's review: the field's name
    was priced at DeepSpeed's default)."""
    alias = f"stage3_{field}"
    return alias if alias in zero or field not in zero else field


def optimizer_pipelining(given: Mapping[str, Any]) -> Tuple[bool, bool]:
    """(reads ahead, writes behind) of tencache's optimizer swapper, from ``offload_optimizer``'s ``pipeline_read``
    and ``pipeline_write`` as the config gives them (a key absent: not given). Stock picks its pipelined swapper with
    them; tencache reads ahead (the first sub-groups' state during backward, the next sub-group's during each update)
    and writes behind (the update's writes finish during the next forward; fp32 masters filled from the parameter
    partitions owe their files instead of being written in it) unless the config turns either off explicitly.
    Reads move the same bytes either way, only later; with writes behind off the update writes, and waits for, every
    tensor of each sub-group it steps, held ones and held prefixes too. The one place of this rule: the swapper (with
    the values pydantic parsed) and the step model (``ZeroSettings``, with the raw JSON's: strings read as pydantic
    reads them) both read it here."""
    return lax_bool(given.get("pipeline_read", True)), lax_bool(given.get("pipeline_write", True))


def model_element_bytes(ds_config: Mapping[str, Any]) -> int:
    """The model's element size: 2 where fp16 or bf16 is enabled (``bfloat16``, DeepSpeed's old name for the bf16
    block, too: precision_config.get_bfloat16_config), else 4 (fp32). The one reader of that fact."""
    # a "bf16" block hides a "bfloat16" one, enabled or not (precision_config.get_bfloat16_config)
    bf16 = ds_config.get("bf16") if "bf16" in ds_config else ds_config.get("bfloat16")
    half = any(lax_bool((section or {}).get("enabled", False)) for section in (ds_config.get("fp16"), bf16))
    return 2 if half else 4


def gradient_accumulation_bytes(ds_config: Mapping[str, Any], source: str = "ds_config") -> int:
    """The element size stage 3 accumulates gradients in (engine.get_data_types): ``data_types.grad_accum_dtype``,
    else the model's (fp16 or bf16: 2, fp32: 4): the dtype of stage 3's gradient partition buffer. The one reader
    of that fact."""
    named = (ds_config.get("data_types") or {}).get("grad_accum_dtype")
    if named is None:
        return model_element_bytes(ds_config)
    if str(named) not in _DTYPE_NAME_BYTES:
        raise TencacheConfigError(f"{source}: data_types.grad_accum_dtype must be one of fp32, fp16 or bf16, got "
                                  f"{named!r}")
    return _DTYPE_NAME_BYTES[str(named)]


def communication_bytes(ds_config: Mapping[str, Any], source: str = "ds_config") -> int:
    """The element size stage 3 reduces gradients in (engine.communication_data_type): ``communication_data_type``
    (DeepSpeed lowercases it: fp32, fp16 or bf16), else the model's (fp16 or bf16: 2, fp32: 4). Its gradient
    bucket (``ipg_buckets``) is allocated in it, and the reduce exchanges it. The one reader of that fact."""
    named = ds_config.get("communication_data_type")
    if named is None:
        return model_element_bytes(ds_config)
    if not isinstance(named, str) or named.lower() not in ("fp32", "fp16", "bf16"):
        raise TencacheConfigError(f"{source}: communication_data_type must be one of fp32, fp16 or bf16, got "
                                  f"{named!r}")
    return _DTYPE_NAME_BYTES[named.lower()]


# The config's optimizer types DeepSpeed builds as DeepSpeedCPUAdam when the optimizer is offloaded (engine.py,
# get_optimizer_configuration; unless "torch_adam"), whose state is fp32 unless "fp32_optimizer_states" is false.
# Stage 3 takes no other optimizer with bf16 or fp16 masters and offload (its own assertion).
DEEPSPEED_CPU_ADAM_TYPES = ("adam", "adamw")
# The state tensors each master element has in the offloaded optimizer DeepSpeed builds from the config's type
# (engine.py: DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion; the names their step() gives them, which are
# the swap files' prefixes, and stage 3 swaps every one). DeepSpeedCPULion allocates Adam's two although its update
# reads only exp_avg (ops/lion/cpu_lion.py). Another type, or a client optimizer, is priced as Adam, and the
# estimate says so (``OptimizerPrecision.state_known``).
ADAM_STATE_NAMES = ("exp_avg", "exp_avg_sq")
STATE_NAMES_BY_TYPE = {"adam": ADAM_STATE_NAMES, "adamw": ADAM_STATE_NAMES, "lion": ADAM_STATE_NAMES,
                       "adagrad": ("exp_avg_sq",)}


@dataclasses.dataclass(frozen=True)
class OptimizerPrecision:
    """The element sizes stage 3's optimizer works in (DeepSpeed 0.19.8: base_optimizer._configure_master_weights,
    engine.get_optimizer_configuration). With masters narrower than fp32, ``master_key`` is the config key that
    made them so, and ``remedy`` what keeps the state in their dtype instead of fp32; ``from_config``: the config
    names the optimizer (else a client optimizer, whose state dtype only the run knows); ``state_names``: the state
    tensors a master element has (Adam's and Lion's two, Adagrad's one), ``state_known`` false where they are
    Adam's by assumption (another type, or a client optimizer)."""

    master_bytes: int = 4   # the masters and the gradients stage 3 hands the optimizer (master_weights_and_grads)
    state_bytes: int = 4    # the optimizer's state (Adam's moments)
    master_key: Optional[str] = None
    remedy: str = ""
    from_config: bool = True
    state_names: Tuple[str, ...] = ADAM_STATE_NAMES
    state_known: bool = True

    @property
    def mixed(self) -> bool:
        """State wider than the masters: one sub-group's tensors in two dtypes."""
        return self.state_bytes != self.master_bytes


def optimizer_precision(ds_config: Mapping[str, Any]) -> OptimizerPrecision:
    """From a DeepSpeed config. Stage 3 reads the masters' keys whatever "enabled" says, and with narrower masters and
    the optimizer offloaded takes DeepSpeedCPUAdam only (its own assertion): built from the config's "adam" or
    "adamw" (unless "torch_adam", whose state follows the masters), or given by the user, its state is fp32 unless
    "fp32_optimizer_states" is false (DeepSpeed's truthiness) or "bf16_optimizer_states" is set. A client
    optimizer is taken to have that default; the run checks the one it gets (optimizer_swapper.py)."""
    optimizer = ds_config.get("optimizer") if isinstance(ds_config.get("optimizer"), Mapping) else None
    optimizer_type = str((optimizer or {}).get("type", "")).lower()
    state_names = STATE_NAMES_BY_TYPE.get(optimizer_type, ADAM_STATE_NAMES)
    state = dict(state_names=state_names, state_known=optimizer_type in STATE_NAMES_BY_TYPE)
    section = next((key for key in ("bf16", "bfloat16") if isinstance(ds_config.get(key), Mapping)), "bf16")
    bf16 = ds_config.get(section) if isinstance(ds_config.get(section), Mapping) else {}
    fp16 = ds_config.get("fp16") if isinstance(ds_config.get("fp16"), Mapping) else {}
    if lax_bool(bf16.get("bf16_master_weights_and_grads", False)):  # ("false" is False, as DeepSpeed reads it)
        master_key = f"{section}.bf16_master_weights_and_grads"
        remedy = (f'set "bf16_optimizer_states": true in "{section}" (the state in bf16, as stock CPU offload runs '
                  f'it) or "fp32_optimizer_states": false in optimizer.params')
        fp32_states_default = not lax_bool(bf16.get("bf16_optimizer_states", False))
    elif lax_bool(fp16.get("fp16_master_weights_and_grads", False)):
        master_key = "fp16.fp16_master_weights_and_grads"
        remedy = 'set "fp32_optimizer_states": false in optimizer.params (the state in fp16)'
        fp32_states_default = True
    else:
        return OptimizerPrecision(from_config="optimizer" in ds_config, **state)
    if optimizer is None:
        return OptimizerPrecision(2, 4 if fp32_states_default else 2, master_key, remedy, from_config=False, **state)
    params = optimizer.get("params") if isinstance(optimizer.get("params"), Mapping) else {}
    cpu_adam = optimizer_type in DEEPSPEED_CPU_ADAM_TYPES and not params.get("torch_adam")
    asked = params.get("fp32_optimizer_states")
    # (plain truthiness: DeepSpeed hands the value to DeepSpeedCPUAdam as given, a string "false" is true there)
    fp32_states = cpu_adam and fp32_states_default and (asked is None or bool(asked))
    return OptimizerPrecision(2, 4 if fp32_states else 2, master_key, remedy, **state)


# The "aio" settings tencache's swappers read themselves: threads per store and tensor padding
# (intra_op_parallelism), the smallest tensor swapped (block_size). DeepSpeed reads them unchecked
# (runtime/swap_tensor/aio_config.py): 0 divided a padding by zero after the swap folder was made, a negative
# count padded tensors shorter than themselves, a fraction was truncated.
AIO_WHOLE_NUMBERS = ("intra_op_parallelism", "block_size")
# tencache's limit, not DeepSpeed's: a checkpoint's swap files are told apart by their padding for at most this many
# aio threads (saved_layout.py; 1 KiB per thread), so a run with more could not load its own checkpoints (helper-206)
MAX_INTRA_OP_PARALLELISM = 64


def check_aio_settings(aio: Any, source: str = "") -> None:
    """``aio`` (a DeepSpeed config's "aio" section, None: absent): the settings tencache reads are positive whole
    numbers (JSON 1e6 counts as one). Raises TencacheConfigError naming ``source`` (a prefix, e.g. the file) and the
    key."""
    if aio is None:
        return
    if not isinstance(aio, Mapping):
        raise TencacheConfigError(f"{source}aio must be an object, got {aio!r}")
    for name in AIO_WHOLE_NUMBERS:
        if name not in aio:
            continue
        value = aio[name]
        whole = (not isinstance(value, bool) and isinstance(value, (int, float)) and finite(value)
                 and value == int(value) and value >= 1)
        if not whole:
            raise TencacheConfigError(f"{source}aio.{name} must be a whole number of 1 or more, got {value!r}: "
                                      f"tencache's swappers size their threads and tensor padding from it")


@dataclasses.dataclass(frozen=True)
class ZeroSettings:
    """The DeepSpeed settings that change what a step moves (defaults: DeepSpeed 0.19.8's)."""

    offload_param: str = "none"       # "nvme", "cpu" or "none"
    offload_optimizer: str = "none"
    param_buffer_count: int = 5
    param_buffer_size: int = int(1e8)
    max_in_cpu: int = int(1e9)
    param_pin_memory: bool = True
    optimizer_buffer_count: int = 4
    optimizer_pin_memory: bool = True
    pipelined_optimizer: bool = False  # pipeline_read or pipeline_write
    # tencache reads the optimizer's state ahead (in backward, and the next sub-group's in each update) and writes
    # the update's tensors behind it unless pipeline_read / pipeline_write is false explicitly
    # (``optimizer_pipelining`` above; writes in the update then take every tensor of a sub-group, held or not)
    tencache_reads_ahead: bool = True
    tencache_writes_behind: bool = True
    sub_group_size: int = int(1e9)
    max_reuse_distance: int = int(1e9)
    persistence_threshold: int = int(1e5)
    prefetch_bucket_size: int = int(5e7)
    reduce_bucket_size: int = int(5e8)
    aio_block_size: int = MIB
    aio_intra_op: int = 1
    element_bytes: int = 2             # bf16/fp16 on, else fp32
    grad_accum_bytes: int = 2          # data_types.grad_accum_dtype's element size, else element_bytes
    comm_element_bytes: int = 2        # communication_data_type's element size, else element_bytes
    precision: OptimizerPrecision = OptimizerPrecision()  # the masters' and optimizer state's element sizes
    tencache: Optional[TencacheConfig] = None  # an enabled "tencache" block, else None

    @classmethod
    def from_ds_config(cls, ds_config: Mapping[str, Any], source: str = "ds_config") -> "ZeroSettings":
        """Raises TencacheConfigError naming ``source`` and the key for a config the model cannot describe."""
        if not isinstance(ds_config, Mapping):
            raise TencacheConfigError(f"{source}: a DeepSpeed config is a JSON object")

        def section(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
            """``parent[key]``, an object (absent or null: empty); anything else is refused naming ``path``."""
            value = parent.get(key)
            if value is None:
                return {}
            if not isinstance(value, Mapping):
                raise TencacheConfigError(f"{source}: {path} must be an object, got {value!r}")
            return value

        # sections the other readers below take as objects too (a "bf16": true stopped them with an AttributeError)
        for key in ("fp16", "bf16", "bfloat16", "data_types"):
            section(ds_config, key, key)
        zero = section(ds_config, "zero_optimization", "zero_optimization")
        # (pydantic's lax reading, as the run's: "stage": "3" trains, and an absent stage is DeepSpeed's default 0;
        # helper-244's review: refused, "got '3'", "got None")
        if lax_int(zero.get("stage", 0)) != 3:
            raise TencacheConfigError(f"{source}: zero_optimization.stage must be 3 (ZeRO-3 / ZeRO-Infinity), got "
                                      f"{zero.get('stage', 0)!r}")
        offload_param = section(zero, "offload_param", "zero_optimization.offload_param")
        offload_optimizer = section(zero, "offload_optimizer", "zero_optimization.offload_optimizer")
        aio = section(ds_config, "aio", "aio")
        check_aio_settings(aio, source=f"{source}: ")  # as the run refuses them (zero_sections.py)
        config = config_of_ds_dict(ds_config)

        def device(offload: Mapping[str, Any], key: str) -> str:
            value = str(offload.get("device", "none")).lower()
            if value not in ("nvme", "cpu", "none"):
                raise TencacheConfigError(f"{source}: zero_optimization.{key}.device must be nvme, cpu or none, got "
                                          f"{offload.get('device')!r}")
            return value

        def number(parent: Mapping[str, Any], key: str, path: str, default: int) -> int:
            value = lax_int(parent.get(key, default))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not finite(value) or value < 0:
                raise TencacheConfigError(f"{source}: {path}.{key} must be a finite non-negative number, got {value!r}")
            return int(value)

        ratio = offload_optimizer.get("ratio", 1.0)
        try:
            whole = float(ratio) >= 1 and not isinstance(ratio, bool)  # (pydantic's float: "1.0" too)
        except (TypeError, ValueError):
            whole = False
        if device(offload_optimizer, "offload_optimizer") != "none" and not whole:
            # ZeRO-Offload++: the first sub-groups' masters, state and gradients on the device (stage3.py), 16 B an
            # element neither model places there (helper-223: "fits" on a card it would not fit)
            raise TencacheConfigError(f"{source}: zero_optimization.offload_optimizer.ratio {ratio!r} (a part of the "
                                      "optimizer on the device, ZeRO-Offload++) is not modelled: estimate with ratio "
                                      "1, all of it on cpu")
        z, p, o = "zero_optimization", "zero_optimization.offload_param", "zero_optimization.offload_optimizer"
        return cls(
            offload_param=device(offload_param, "offload_param"),
            offload_optimizer=device(offload_optimizer, "offload_optimizer"),
            param_buffer_count=number(offload_param, "buffer_count", p, cls.param_buffer_count),
            param_buffer_size=number(offload_param, "buffer_size", p, cls.param_buffer_size),
            max_in_cpu=number(offload_param, "max_in_cpu", p, cls.max_in_cpu),
            param_pin_memory=lax_bool(offload_param.get("pin_memory", True)),
            optimizer_buffer_count=number(offload_optimizer, "buffer_count", o, cls.optimizer_buffer_count),
            optimizer_pin_memory=lax_bool(offload_optimizer.get("pin_memory", True)),
            pipelined_optimizer=lax_bool(offload_optimizer.get("pipeline_read", False))
            or lax_bool(offload_optimizer.get("pipeline_write", False)),
            tencache_reads_ahead=optimizer_pipelining(offload_optimizer)[0],
            tencache_writes_behind=optimizer_pipelining(offload_optimizer)[1],
            sub_group_size=number(zero, "sub_group_size", z, cls.sub_group_size),
            max_reuse_distance=number(zero, stage3_key(zero, "max_reuse_distance"), z, cls.max_reuse_distance),
            persistence_threshold=number(zero, stage3_key(zero, "param_persistence_threshold"), z,
                                         cls.persistence_threshold),
            prefetch_bucket_size=number(zero, stage3_key(zero, "prefetch_bucket_size"), z, cls.prefetch_bucket_size),
            reduce_bucket_size=number(zero, "reduce_bucket_size", z, cls.reduce_bucket_size),
            aio_block_size=number(aio, "block_size", "aio", cls.aio_block_size),
            aio_intra_op=number(aio, "intra_op_parallelism", "aio", cls.aio_intra_op),
            element_bytes=model_element_bytes(ds_config),
            grad_accum_bytes=gradient_accumulation_bytes(ds_config, source),
            comm_element_bytes=communication_bytes(ds_config, source),
            precision=optimizer_precision(ds_config),
            tencache=config if config.enabled else None)

    def swap_nbytes(self, numel: int, element_bytes: Optional[int] = None) -> int:
        """Bytes a swapped tensor of ``numel`` elements occupies on file and in a swap buffer (DeepSpeed's
        io_aligned_numel)."""
        size = element_bytes or self.element_bytes
        alignment = AIO_ALIGNED_BYTES * self.aio_intra_op // size
        return -(-numel // alignment) * alignment * size

    @property
    def min_swap_bytes(self) -> int:
        """Smaller partitions stay in host memory (DeepSpeed's MIN_AIO_BYTES or the aio block size)."""
        return max(MIB, self.aio_block_size)


@dataclasses.dataclass(frozen=True)
class Partition:
    """One parameter's partition on one rank."""

    key: str
    numel: int          # elements of the whole parameter
    part_numel: int     # this rank's elements
    on_nvme: bool
    persistent: bool


@dataclasses.dataclass(frozen=True)
class Fetch:
    """ZeRO-3 gathers ``keys`` for a use of ``module`` (``phase``: "forward", "backward" or "recompute");
    ``flops`` of compute follow it."""

    module: str
    keys: Tuple[str, ...]
    phase: str
    flops: float


@dataclasses.dataclass(frozen=True)
class Workload:
    """One rank's step: ``gas`` micro-steps of ``fetches`` and their compute, then the optimizer over
    ``sub_groups`` (lists of partition keys)."""

    shape: ModelShape
    zero: ZeroSettings
    world_size: int
    micro_batch: int
    seq_len: int
    gas: int
    checkpointing: bool
    partitions: Dict[str, Partition]
    fetches: Tuple[Fetch, ...]
    sub_groups: Tuple[Tuple[str, ...], ...]

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def rank_elements(self) -> int:
        return sum(p.part_numel for p in self.partitions.values())

    def sub_group_elements(self, index: int) -> int:
        return sum(self.partitions[key].part_numel for key in self.sub_groups[index])

    @property
    def params_in_host_memory_elements(self) -> int:
        """The parameter partitions' elements stage 3 keeps in host memory for good: with ``offload_param`` "cpu"
        all of them (its flat buffer); on "nvme" its flat buffer of ``max_in_cpu`` elements at most, allocated whole
        whatever fits in it (``_create_param_groups_fp16_flat_cpu_memory``). (Not counted, as before: partitions too
        small to swap outside it, each in its own tensor, a few hundred KiB on gpt2-small.)"""
        zero = self.zero
        if zero.offload_param == "cpu":
            return self.rank_elements
        if zero.offload_param != "nvme":
            return 0
        return min(max(0, zero.max_in_cpu), self.rank_elements)

    @property
    def largest_sub_group_elements(self) -> int:
        return max((self.sub_group_elements(i) for i in range(len(self.sub_groups))), default=0)

    def read_fetches(self) -> List[Tuple[int, str]]:
        """(fetch index, key) of every gather that needs the partition itself, after ZeRO-3's own retention:
        a parameter used again within ``stage3_max_reuse_distance`` elements stays gathered (the turn-around
        module at least: its forward and backward follow each other), and persistent ones never go."""
        reads: List[Tuple[int, str]] = []
        last_seen: Dict[str, int] = {}  # key -> cumulative elements fetched when it was last used
        fetched = 0
        kept_at_turn = self._kept_at_turn_around()
        backward_seen = set()
        for index, fetch in enumerate(self.fetches):
            for key in fetch.keys:
                partition = self.partitions[key]
                previous = last_seen.get(key)
                turn = fetch.phase == "backward" and key in kept_at_turn and key not in backward_seen
                if fetch.phase == "backward":
                    backward_seen.add(key)
                retained = partition.persistent or turn or (previous is not None and
                                                            fetched - previous <= self.zero.max_reuse_distance)
                if not retained:
                    reads.append((index, key))
                last_seen[key] = fetched + partition.numel
            fetched += sum(self.partitions[key].numel for key in fetch.keys)
        return reads


    def _kept_at_turn_around(self) -> set:
        """Parameters ZeRO-3 keeps gathered from their last forward use to their first backward use: walking back
        from the head, the modules after the last block and the last block's, as long as the NVMe partitions among
        them fit ``offload_param.buffer_count`` slots. The coordinator does not release a parameter whose next use
        its prefetcher has already passed over (partitioned_param_coordinator.__params_to_release). Measured with
        stage3_max_reuse_distance 0: gpt2-tiny, gpt2-small and gpt2-medium read exactly their last block's four
        matrices once, not twice (docs/estimate.md); with 5 slots that is also every slot (head + 4), so whether
        the bound is the block or the slots is not settled by these runs."""
        if self.checkpointing:
            return set()
        last_layer = max((m.layer for m in self.shape.modules), default=-1)
        kept, slots, in_last_block = set(), self.zero.param_buffer_count, False
        for module in reversed(self.shape.modules):
            if module.layer not in (last_layer, -1) or (module.layer == -1 and in_last_block):
                break  # the block before, or the embeddings of a one-block model
            in_last_block = in_last_block or module.layer == last_layer
            keys = [key for key, _numel in module.params]
            swapped = sum(1 for key in keys if self.partitions[key].on_nvme and key not in kept)
            if swapped > slots:
                break
            slots -= swapped
            kept.update(keys)
        return kept


def build_workload(shape: ModelShape, zero: ZeroSettings, world_size: int, micro_batch: int, seq_len: int,
                   gas: int, checkpointing: bool) -> Workload:
    partitions: Dict[str, Partition] = {}
    for key, numel in shape.parameters().items():
        part = -(-numel // world_size)
        swappable = zero.offload_param == "nvme" and part * zero.element_bytes >= zero.min_swap_bytes
        partitions[key] = Partition(key, numel, part, swappable, numel < zero.persistence_threshold)
    sub_groups = _sub_groups(partitions, zero.sub_group_size)
    if zero.offload_param == "nvme":  # the sub-groups stage 3 pulls into its CPU buffer for good are off NVMe
        for group in _sub_groups_in_cpu_buffer(partitions, sub_groups, zero.max_in_cpu):
            for key in group:
                partitions[key] = dataclasses.replace(partitions[key], on_nvme=False)
    tokens = micro_batch * seq_len
    forward = [Fetch(m.name, tuple(k for k, _ in m.params), "forward", shape.module_forward_flops(m, tokens, seq_len))
               for m in shape.modules]
    backward: List[Fetch] = []
    if checkpointing:  # each block's forward runs again just before its backward
        blocks: Dict[int, List[Fetch]] = {}
        for module, fetch in zip(shape.modules, forward):
            blocks.setdefault(module.layer, []).append(fetch)
        outside = blocks.pop(-1, [])
        first_block = min((i for i, m in enumerate(shape.modules) if m.layer >= 0), default=len(forward))
        head = [f for f in outside if forward.index(f) < first_block]  # embeddings: before the blocks
        tail = [f for f in outside if forward.index(f) > first_block]  # final norm, head: after them
        backward += [dataclasses.replace(f, phase="backward", flops=2 * f.flops) for f in reversed(tail)]
        for layer in sorted(blocks, reverse=True):
            backward += [dataclasses.replace(f, phase="recompute") for f in blocks[layer]]
            backward += [dataclasses.replace(f, phase="backward", flops=2 * f.flops) for f in reversed(blocks[layer])]
        backward += [dataclasses.replace(f, phase="backward", flops=2 * f.flops) for f in reversed(head)]
    else:
        backward = [dataclasses.replace(f, phase="backward", flops=2 * f.flops) for f in reversed(forward)]
    return Workload(shape, zero, world_size, micro_batch, seq_len, gas, checkpointing, partitions,
                    tuple(forward + backward), sub_groups)


def _sub_groups_in_cpu_buffer(partitions: Dict[str, Partition], sub_groups: Sequence[Tuple[str, ...]],
                              max_in_cpu: int) -> List[Tuple[str, ...]]:
    """The sub-groups stage 3 keeps in its CPU buffer of ``max_in_cpu`` elements with the parameters on NVMe
    (``_create_fp16_partitions_with_defragmentation``): whole sub-groups in order while they fit, none after the
    first that does not (its offset moves past it all the same). Until 2026-12-07 the model took single parameters
    while they fit: at DeepSpeed's defaults (max_in_cpu and sub_group_size 1e9) a rank of more than 1e9 elements
    keeps nothing there, and the model kept 1e9 elements off NVMe (helper-212)."""
    kept, offset = [], 0
    for group in sub_groups:
        total = sum(partitions[key].part_numel for key in group)
        if offset + total > max_in_cpu:
            break
        kept.append(group)
        offset += total
    return kept


def _sub_groups(partitions: Dict[str, Partition], sub_group_size: int) -> Tuple[Tuple[str, ...], ...]:
    """stage3._create_fp16_sub_groups: parameters in order, a new group once one reaches sub_group_size (0: one
    parameter each, as DeepSpeed takes it; was one sub-group for all until 2026-12-07: helper-212)."""
    total = sum(p.part_numel for p in partitions.values())
    if sub_group_size >= total:
        return (tuple(partitions),)
    groups, group, size = [], [], 0
    for key, partition in partitions.items():
        group.append(key)
        size += partition.part_numel
        if size >= sub_group_size:
            groups.append(tuple(group))
            group, size = [], 0
    if group:
        groups.append(tuple(group))
    return tuple(groups)
