"""Where a DeepSpeed config and its "tencache" block come from: the one reader of the block. Owns: turning each
form DeepSpeed takes a config in (its DeepSpeedConfig object, a dict, a JSON/HJSON path or base64 string, the
arguments of a ``deepspeed.initialize`` call) into the raw dict, and the validated block of any of them. Finding
and parsing the block in that dict is config.config_of_ds_dict. Does not own: the checks of the block against
DeepSpeed's sections (config_bridge.validate_ds_config).

Imports only tencache's config, and DeepSpeed's config reader when a string is read: refusal.py uses this module
when the rest of the adapters could not be imported."""
from typing import Any, Optional

from ...config import TencacheConfig, config_of_ds_dict


def ds_config_dict(ds_config: Any) -> Optional[dict]:
    """The raw dict of a DeepSpeed config: a DeepSpeedConfig's kept user dict (``_param_dict``: DeepSpeed's parsed
    sections drop the "tencache" block), a dict as it is, or a string read as DeepSpeed reads it (a JSON/HJSON
    path, else base64). None for None, for anything else, and for a string that cannot be read: DeepSpeed then
    raises its own error for it."""
    raw = getattr(ds_config, "_param_dict", ds_config)
    if isinstance(raw, str):
        # DeepSpeed's own reader; imported outside the try: a DeepSpeed without it must fail loudly (contract.py),
        # not read every path config as "no block"
        from deepspeed.runtime.tensor_parallel.init_utils import load_ds_config
        try:
            raw = load_ds_config(raw)
        except Exception:  # pylint: disable=broad-except  # unreadable: DeepSpeed says why, in its own words
            return None
    return raw if isinstance(raw, dict) else None


def tencache_config(ds_config: Any) -> TencacheConfig:
    """The validated "tencache" block of a DeepSpeed config in any form ds_config_dict reads; disabled when there
    is no config or no block. Raises TencacheConfigError naming the key of an invalid block."""
    return config_of_ds_dict(ds_config_dict(ds_config))


def ds_config_of_initialize_call(bound_arguments: dict) -> Optional[dict]:
    """The raw config dict a ``deepspeed.initialize`` call will use, chosen as DeepSpeed does (``config``, else
    ``config_params``, else ``args.deepspeed_config``/``args.deepscale_config``) and read by ds_config_dict. None
    when there is none or it cannot be read: DeepSpeed then raises its own error for it."""
    config = bound_arguments.get("config")
    if config is None:
        config = bound_arguments.get("config_params")
    for name in ("deepspeed_config", "deepscale_config"):
        if config is None:
            config = getattr(bound_arguments.get("args"), name, None)
    return ds_config_dict(config)


__all__ = ["ds_config_dict", "tencache_config", "ds_config_of_initialize_call"]
