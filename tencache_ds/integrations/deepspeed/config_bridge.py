"""The "tencache" block against DeepSpeed. Owns: the call that runs every check before a file is written
(validate_ds_config: preflight.py's sequence, with the installed DeepSpeed's version checked within it),
which config the ZeRO-3 optimizer or the ``deepspeed.initialize`` call being built has, and the facts about
DeepSpeed's swap layout that both swappers share. Does not own: the block's keys and types (config.py), reading a
DeepSpeed config and finding the block in it (config_source.py), the checks of DeepSpeed's sections themselves
(zero_sections.py, which needs no DeepSpeed) or checks against the machine alone (config_checks.py)."""
import contextlib
import os
import sys
import threading
from typing import Any, Optional

import torch
from deepspeed.accelerator import get_accelerator

from ...config import AUTO, CONFIG_KEY, TencacheConfig, config_of_ds_dict
from ...errors import TencacheConfigError, TencacheResourceError
from ...io import folder_lock
from ...plan.budget import MachineResources
from ...preflight import checked_block
from ...units import fmt_bytes
from .config_source import ds_config_dict
from .contract import require_supported_deepspeed

# DeepSpeed pads every swapped tensor to `1024 bytes x aio.intra_op_parallelism` (swap_tensor/utils.py
# AIO_ALIGNED_BYTES); our files keep that layout so DeepSpeed code that reads them (offload_optimizer.fast_init)
# still finds each tensor at offset 0 with the length it expects.
AIO_ALIGNED_BYTES = 1024
MIN_SWAPPABLE_BYTES = 1024 * 1024
# DeepSpeed ops a ZeRO-Infinity run loads (cpu_adam in deepspeed.initialize, async_io by stock swappers): a stale
# build lock of either makes the run wait forever, silently (ext_lock.py).
DEEPSPEED_OPS = ("cpu_adam", "async_io")


def validate_ds_config(ds_config: Any, machine: Optional[MachineResources] = None) -> TencacheConfig:
    """The validated "tencache" block of a DeepSpeed config, after every check that can be made before a file is
    written. Raises TencacheConfigError (a wrong or conflicting key) or TencacheResourceError (a path this user
    cannot write), each naming the key as a dotted path and the remedy; TencacheConfigError too when the installed
    DeepSpeed is not a supported version (contract.py).

    ``ds_config`` is anything config_source.ds_config_dict reads (a raw dict, a DeepSpeedConfig, a path);
    anything else means "no block". ``machine`` defaults to this host's (tests pass a fixed one). A disabled or
    absent block is only parsed: such a run is stock DeepSpeed, whatever its other sections say.
    """
    raw = ds_config_dict(ds_config)
    if raw is None:
        return config_of_ds_dict(None)
    # an unsupported DeepSpeed refuses an enabled block, naming both versions, before DeepSpeed's sections are read
    config = checked_block(raw, machine=(lambda: machine) if machine is not None else MachineResources.probe,
                           before_sections=require_supported_deepspeed)
    if config.enabled:
        check_device_budget(config)
    return config


def check_device_budget(config: TencacheConfig) -> None:
    """A configured ``device_cache_bytes`` fits the device: on a GPU, gathered parameters kept past their release
    take its memory, so a budget above what it has (a typo: "16TB") kept everything and the step ran out of memory
    mid-run (helper-161's review). On the CPU accelerator the budget is capped by the host tier's parameter share."""
    if config.device_cache_bytes == AUTO or accelerator_is_host():
        return
    total = int(get_accelerator().total_memory())
    if config.device_cache_bytes > total:
        raise TencacheConfigError(
            f"{CONFIG_KEY}.device_cache_bytes = {fmt_bytes(config.device_cache_bytes)} is more than the device has "
            f"({fmt_bytes(total)} on {get_accelerator().device_name()}): the parameters it keeps gathered would not "
            f'fit beside a step; set less, or "auto"')


def device_free_bytes(accelerator=None) -> int:
    """The device's free memory now, as the device tier's "auto" budget reads it: on CUDA through
    ``torch.cuda.mem_get_info``, which honours CUDA_VISIBLE_DEVICES and MIG: DeepSpeed's ``available_memory()``
    reads NVML by index, parsing CUDA_VISIBLE_DEVICES as integers (a UUID or MIG name there stopped the run at its
    second step, whatever device_cache_bytes said) and reading the parent GPU on MIG (helper-175). The caching
    allocator's free blocks count as used, as in NVML's reading: the budget is sized against the step's peak, which
    leaves no room for the allocator's own at that peak where they count as free (helper-179); counting them needs
    the tier's own bytes out of the peak (not built). Elsewhere the accelerator's ``available_memory()``."""
    accelerator = accelerator or get_accelerator()
    if accelerator.device_name() == "cuda" and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(torch.cuda.current_device())
        return int(free)
    return int(accelerator.available_memory())


_initializing = threading.local()  # the validated block of the deepspeed.initialize call this thread is in


@contextlib.contextmanager
def initializing(config: TencacheConfig):
    """While a ``deepspeed.initialize`` call whose config has the validated block ``config`` runs (install.py
    wraps it): the block initialize_call_config returns. Nested calls restore the outer one."""
    outer = getattr(_initializing, "config", None)
    _initializing.config = config
    try:
        yield
    finally:
        _initializing.config = outer


def initialize_call_config() -> Optional[TencacheConfig]:
    """The validated block of the ``deepspeed.initialize`` call this thread is in, or None outside one."""
    return getattr(_initializing, "config", None)


_building = threading.local()  # the ZeRO-3 optimizer this thread is building, and its raw config (install.py)


@contextlib.contextmanager
def building_stage3(ds_config, optimizer=None):
    """While DeepSpeedZeroOptimizer_Stage3.__init__ runs with ``ds_config`` (install.py wraps it): the config
    find_stage3_ds_config returns, and the optimizer being built, which find_stage3_optimizer returns. Nested builds
    restore the outer one."""
    outer = getattr(_building, "config", None), getattr(_building, "optimizer", None)
    _building.config, _building.optimizer = ds_config_dict(ds_config), optimizer
    try:
        yield
    finally:
        _building.config, _building.optimizer = outer


def find_stage3_ds_config() -> Optional[dict]:
    """The raw DeepSpeed config dict of the ZeRO-3 optimizer that is being built, or None.

    DeepSpeed builds the optimizer swapper inside DeepSpeedZeroOptimizer_Stage3.__init__ ->
    _configure_tensor_swapping and passes it no config (deepspeed-integration.md, b). install.py wraps that
    __init__ and names its ``ds_config`` argument (building_stage3); an optimizer built without the wrapper (a
    subclass that does not call it) is found by its ``ds_config`` local in the calling frames.
    """
    config = getattr(_building, "config", None)
    if config is not None:
        return config
    frame = _stage3_init_frame()
    return None if frame is None else ds_config_dict(frame.f_locals["ds_config"])


def find_stage3_optimizer():
    """The DeepSpeedZeroOptimizer_Stage3 being built (the one whose __init__ builds the calling swapper), or None;
    found as find_stage3_ds_config finds its config."""
    optimizer = getattr(_building, "optimizer", None)
    if optimizer is not None:
        return optimizer
    frame = _stage3_init_frame()
    return None if frame is None else frame.f_locals["self"]


def _stage3_init_frame():
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "__init__" and "ds_config" in frame.f_locals:
            owner = frame.f_locals.get("self")
            if owner is not None and type(owner).__name__.endswith("Stage3"):
                return frame
        frame = frame.f_back
    return None


def accelerator_is_host() -> bool:
    """Is DeepSpeed's accelerator host memory (its CPU accelerator)?"""
    return get_accelerator().device_name() == "cpu"


def io_aligned_numel(numel: int, dtype: torch.dtype, intra_op_parallelism: int) -> int:
    """``numel`` rounded up to DeepSpeed's swap alignment, e.g. 1000 bf16 elements -> 1024 (1 KiB / 2 B)."""
    alignment = AIO_ALIGNED_BYTES * intra_op_parallelism // torch.empty((), dtype=dtype).element_size()
    return -(-numel // alignment) * alignment


@contextlib.contextmanager
def swap_folder_held(folder: str, nvme_path: str, config_key: str):
    """Hold ``folder`` for this process (io/folder_lock.py) before anything in it is removed or written, for what the
    body does next (a swapper's set-up), and yield the key its ``close`` lets go of; let go if the body fails.
    Another run that holds the folder is an error naming the config key and that run."""
    try:
        key = folder_lock.hold(folder)
    except folder_lock.FolderInUse as err:
        raise TencacheResourceError(
            f"{config_key} = '{nvme_path}': its swap folder {err.folder} is in use by another run ({err.holder}); "
            f"two runs in one folder remove and overwrite each other's swap files. Give each run its own "
            f"nvme_path") from None
    except OSError as err:
        raise TencacheResourceError(f"{config_key} = '{nvme_path}' is not usable: cannot lock {folder}: "
                                    f"{err.strerror or err}") from None
    try:
        yield key
    except BaseException:
        folder_lock.let_go(key)
        raise


def prepare_swap_folder(folder: str, nvme_path: str, config_key: str) -> None:
    """Create ``folder`` (inside ``nvme_path``) and check that it is writable; the error names the config key."""
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, ".tencache-write-probe")
        with open(probe, "wb") as handle:
            handle.write(b"\0" * 4096)
        os.remove(probe)
    except OSError as err:
        raise TencacheResourceError(f"{config_key} = '{nvme_path}' is not usable: cannot write to {folder}: "
                                    f"{err.strerror or err}") from None


__all__ = ["validate_ds_config", "find_stage3_ds_config", "find_stage3_optimizer",
           "building_stage3", "initializing", "initialize_call_config",
           "io_aligned_numel", "prepare_swap_folder", "swap_folder_held",
           "MIN_SWAPPABLE_BYTES"]
