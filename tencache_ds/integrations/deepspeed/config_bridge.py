"""Where the "tencache" block comes from inside DeepSpeed. Owns: pulling it out of DeepSpeed's config objects and
the facts about DeepSpeed's swap layout that both swappers share. Does not own: validation (config.py)."""
import os
import sys
from typing import Any, Optional

import torch

from ...config import CONFIG_KEY, TencacheConfig, parse_config
from ...errors import TencacheResourceError

# DeepSpeed pads every swapped tensor to `1024 bytes x aio.intra_op_parallelism` (swap_tensor/utils.py
# AIO_ALIGNED_BYTES); our files keep that layout so DeepSpeed code that reads them (offload_optimizer.fast_init)
# still finds each tensor at offset 0 with the length it expects.
AIO_ALIGNED_BYTES = 1024
MIN_SWAPPABLE_BYTES = 1024 * 1024


def config_from_ds_config(ds_config: Any) -> TencacheConfig:
    """The validated block from a DeepSpeedConfig object (its kept user dict) or from a raw dict."""
    raw = getattr(ds_config, "_param_dict", ds_config)
    return parse_config(raw.get(CONFIG_KEY) if isinstance(raw, dict) else None)


def find_stage3_ds_config() -> Optional[dict]:
    """The raw DeepSpeed config dict of the ZeRO-3 optimizer that is being built, or None.

    DeepSpeed builds the optimizer swapper inside DeepSpeedZeroOptimizer_Stage3.__init__ ->
    _configure_tensor_swapping and passes it no config (deepspeed-integration.md, b). The engine hands that
    __init__ its raw config dict as ``ds_config``, so we read it from that frame instead of patching DeepSpeed
    a second time. tests/deepspeed/test_parity.py fails if a DeepSpeed release moves it.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "__init__" and "ds_config" in frame.f_locals:
            owner = frame.f_locals.get("self")
            if owner is not None and type(owner).__name__.endswith("Stage3"):
                config = frame.f_locals["ds_config"]
                return getattr(config, "_param_dict", config)
        frame = frame.f_back
    return None


def io_aligned_numel(numel: int, dtype: torch.dtype, intra_op_parallelism: int) -> int:
    """``numel`` rounded up to DeepSpeed's swap alignment, e.g. 1000 bf16 elements -> 1024 (1 KiB / 2 B)."""
    alignment = AIO_ALIGNED_BYTES * intra_op_parallelism // torch.empty((), dtype=dtype).element_size()
    return -(-numel // alignment) * alignment


def prepare_swap_folder(folder: str, nvme_path: str, config_key: str) -> None:
    """Create ``folder`` (inside ``nvme_path``) and check that it is writable; the error names the config key."""
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, ".tencache-write-probe")
        with open(probe, "wb") as handle:
            handle.write(b"\0" * 4096)
        os.remove(probe)
    except OSError as err:
        raise TencacheResourceError(f"{config_key} = {nvme_path!r} is not usable: cannot write to {folder}: "
                                    f"{err.strerror or err}") from None


__all__ = ["config_from_ds_config", "find_stage3_ds_config", "io_aligned_numel", "prepare_swap_folder",
           "MIN_SWAPPABLE_BYTES"]
