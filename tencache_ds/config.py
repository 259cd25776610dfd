"""The "tencache" block of a DeepSpeed config. Owns: keys, defaults, validation. Does not own: machine facts
(resolving "auto" needs the host's memory, which plan/budget.py reads) or the forms a DeepSpeed config comes in
(integrations/deepspeed/config_source.py turns them into the dict that config_of_ds_dict reads). Leaf module:
imports neither torch nor deepspeed.

The block sits at the top level of ds_config.json, beside DeepSpeed's own sections (DeepSpeed keeps unknown
top-level keys and ignores them, but rejects extra keys inside its own sections):

    "tencache": {"enabled": true, "host_cache_bytes": "auto", "device_cache_bytes": "auto",
                 "metrics_path": "runs/tencache-metrics.jsonl", "profile_path": "runs/profile.json"}
"""
from typing import Any, Literal, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError, field_validator

from .errors import TencacheConfigError
from .units import parse_bytes

# ``import tencache_ds`` installs the swappers in DeepSpeed unless this is "1" (then tencache_ds.install() does, and
# until it is called a config that enables tencache is refused: integrations/deepspeed/refusal.py)
NO_AUTO_INSTALL_ENV = "TENCACHE_NO_AUTO_INSTALL"

CONFIG_KEY = "tencache"
AUTO = "auto"
SCHEMA_VERSION = 1

ByteBudget = Union[int, Literal["auto"]]


class TencacheConfig(BaseModel):
    """Validated "tencache" block. Every field has a default that needs no tuning."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True,
                              use_attribute_docstrings=True)

    version: Literal[1] = SCHEMA_VERSION
    """Version of this block's schema; saved profiles record it."""

    # Strict: pydantic's lax bool would read "enabled": "no", 0 or "off" as false and silently run stock.
    enabled: StrictBool = True
    """Replace DeepSpeed's NVMe swappers with tencache's. True when the block is present; false runs stock DeepSpeed."""

    host_cache_bytes: ByteBudget = AUTO
    """Host memory for holding offloaded tensors beyond the minimum needed to stream them, lent to DeepSpeed without
    copies and written back to NVMe only when evicted or checkpointed: parameter partitions first (pinned slots: each
    held byte saves a read in forward, one in backward and a write after the step), then optimizer state (pageable:
    each held byte saves a read and a write). Per rank: engines trained at once in one process (an actor and a critic)
    share it, the first made taking what its optimizer state needs first. An integer or a size string ("4GiB");
    "auto" starts at 25% of the memory available at start-up divided between the ranks of the node (as the launcher
    tells them: torchrun, deepspeed, mpirun, srun; where none does, as counted among the job's ranks), capped by the
    memlock limit (per process) minus the streaming slots, and after the second optimizer step (once a step's memory
    rise has been measured; the first step's, which creates the optimizer's state, does not count) grows its
    optimizer state into the memory the steps leave free (giving it back under memory pressure); 0 = pure streaming
    (every use reads NVMe, as stock does)."""

    device_cache_bytes: ByteBudget = AUTO
    """Accelerator memory for gathered parameters kept between uses (the device tier): chosen by next use over the
    profiled sequence, so the last layers of the forward stay for the backward and, when the gathered tensor is the
    partition itself, across the optimizer step; otherwise each parameter is gathered once per optimizer step (its
    first use after the update) and kept for the step's other uses. "auto" = 50% of the memory the gathered
    parameters live in that is free (plus what the tier holds), less a step's activation rise, re-read at every
    forward pass. On DeepSpeed's CPU accelerator that memory is the host's: at one rank a gathered parameter is its
    partition, so the tier is carved out of the parameters' share of host_cache_bytes (counted once; a size given
    here is capped by that share); at several ranks it is this rank's share of the available host memory. Ranks use
    the smallest budget any of them has (which parameters are kept decides which all-gathers run). 0 = off
    (DeepSpeed's own release rules). The tier keeps what tencache reads from NVMe: with offload_param.device other
    than "nvme" there is none, and a size given here is refused."""

    metrics_path: Optional[str] = None
    """Where per-step metrics are appended as JSON lines, one object per optimizer step (schema "tencache.metrics/9":
    step time, fetch wait, device and host hit rates, NVMe bytes, prefetches, memory, the host cache budget and the
    host memory reading it follows); tencache_ds.stats(engine) returns the latest. Engines trained at once in one
    process write one file each: a second one alive beside the first to `<root>.engine2<ext>`, and so on. None: no
    file."""

    profile_path: Optional[str] = None
    """Where the execution profile (the steady training step's access order, tensor sizes, compute time between
    accesses and NVMe read times) is saved and reused on the next run; a profile of another model, dtype, world
    size, sub_group_size, gradient accumulation, micro-batch size or activation checkpointing block is reported as
    stale and replaced (one timed at another sequence length, which the config does not say, serves until the order
    changes: delete it to re-time). At several ranks each rank writes its own file, `<root>.rank<r><ext>`. An
    existing file there that is not a profile is refused, not replaced. `tencache-ds profile show` / `tencache-ds
    plan` read it. None: memory only."""

    pin_memory: Literal["best_effort", "required"] = "best_effort"
    """What to do when pages cannot be locked (memlock limit too low): "best_effort" warns once and uses unlocked
    memory; "required" stops with an error that names the limit and how to raise it. Only parameter slots are
    locked, for the accelerator's copies: on DeepSpeed's CPU accelerator "best_effort" locks nothing."""

    log_stats: StrictBool = True
    """Log tencache_ds.stats() once at start-up on rank 0."""

    @field_validator("version", mode="before")
    @classmethod
    def _check_version(cls, value: Any):
        # `type is int`: JSON true would otherwise pass as 1.
        if type(value) is not int or value != SCHEMA_VERSION:
            raise ValueError(f"unsupported version: this tencache_ds reads version {SCHEMA_VERSION} of the block "
                             f"(docs/configuration.md); set \"version\": {SCHEMA_VERSION} or leave the key out")
        return value

    @field_validator("metrics_path", "profile_path", mode="before")
    @classmethod
    def _check_file_path(cls, value: Any):
        # "" would otherwise mean "no file" silently (the writers test the path's truth); null or no key says that
        if isinstance(value, str) and value.strip() == "":
            raise ValueError("an empty path: name a file, or leave the key out (or null) for no file")
        return value

    @field_validator("host_cache_bytes", "device_cache_bytes", mode="before")
    @classmethod
    def _parse_budget(cls, value: Any):
        if value == AUTO:
            return AUTO
        return parse_bytes(value)


# pydantic's wording where it does not say what JSON to write
_PROBLEMS = {"extra_forbidden": "unknown key", "bool_type": "must be true or false"}


def parse_config(block: Any) -> TencacheConfig:
    """Validate a raw "tencache" block. Raises TencacheConfigError naming the offending key."""
    if block is None:
        return TencacheConfig(enabled=False)
    if isinstance(block, bool):  # "tencache": true is a natural shorthand
        return TencacheConfig(enabled=block)
    if not isinstance(block, dict):
        raise TencacheConfigError(f'"{CONFIG_KEY}" must be an object, got {type(block).__name__}: {block!r}')
    try:
        return TencacheConfig.model_validate(block)
    except ValidationError as err:
        problems = []
        for item in err.errors():
            # the key is the location's first part; pydantic may add the branch of a union it tried ("int",
            # "literal['auto']"), which a key of the block may begin with too ("intra_op_parallelism")
            where = [str(part) for part in item["loc"]]
            key = ".".join(where[:1] + [part for part in where[1:] if not part.startswith(("int", "literal"))])
            problem = _PROBLEMS.get(item["type"], item["msg"])
            problem = problem.removeprefix("Value error, ")  # our validators' own words are enough
            problems.append(f'{CONFIG_KEY}.{key}: {problem} (got {item.get("input")!r})')
        if any(item["type"] == "extra_forbidden" for item in err.errors()):
            problems.append(f"allowed keys: {', '.join(TencacheConfig.model_fields)}")
        raise TencacheConfigError("invalid \"tencache\" block:\n  " + "\n  ".join(problems)) from None


def config_of_ds_dict(ds_config: Optional[Mapping[str, Any]]) -> TencacheConfig:
    """The validated "tencache" block of a DeepSpeed config dict: the one place that finds the block and parses it.
    No dict, or no block in it: a disabled block (the run is stock DeepSpeed). DeepSpeed's other forms of a config
    (its config object, a path, base64) become the dict in integrations/deepspeed/config_source.py."""
    return parse_config(ds_config.get(CONFIG_KEY) if isinstance(ds_config, Mapping) else None)


def config_reference_markdown() -> str:
    """docs/configuration.md, generated from the model above (tests/test_config.py keeps the file current)."""
    lines = ["# The \"tencache\" block: configuration reference", "",
             "Generated from `tencache_ds/config.py` by `tencache-ds config-reference > docs/configuration.md`.", "",
             "The block sits at the top level of the DeepSpeed config, beside DeepSpeed's own sections (DeepSpeed",
             "keeps unknown top-level keys and ignores them; it rejects extra keys inside its own sections). An",
             "unknown key or an invalid value stops the run with an error that names the key.", "",
             "With Hugging Face's Trainer or Accelerate, leave out the keys you would set to \"auto\" (their default):",
             "they take every \"auto\" in a DeepSpeed config for a value of their own to fill, and stop at one they do",
             "not know. `\"tencache\": {}` takes every default.", "",
             "```json", '"tencache": {"enabled": true, "host_cache_bytes": "auto", "device_cache_bytes": "auto"}',
             "```", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in TencacheConfig.model_fields.items():
        annotation = str(field.annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
        description = " ".join((field.description or "").split())
        lines.append(f"| `{name}` | `{annotation}` | `{field.default!r}` | {description} |")
    lines += ["", "Byte sizes accept integers (`1073741824`), floats that are whole numbers (`1e9`) and strings with "
              "units (`\"512MiB\"`, `\"1.5GB\"`).", ""]
    return "\n".join(lines)
