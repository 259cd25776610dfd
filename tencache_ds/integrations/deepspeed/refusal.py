"""When tencache's swappers could not be installed. Owns: refusing, at ``deepspeed.initialize``, a config that
enables tencache, so such a run fails with the install error instead of silently training stock DeepSpeed.
Imports only DeepSpeed and tencache's config (the rest of the adapters may be what failed)."""
import deepspeed

from ...config import block_from_ds_config, parse_config
from ...errors import TencacheError


def refuse_tencache_configs(install_error: Exception) -> None:
    original = deepspeed.initialize

    def initialize(*args, **kwargs):
        candidates = (kwargs.get("config"), kwargs.get("config_params"),
                      getattr(kwargs.get("args"), "deepspeed_config", None))
        for candidate in candidates:
            try:
                enabled = parse_config(block_from_ds_config(candidate)).enabled
            except (OSError, ValueError, TencacheError):
                enabled = False  # DeepSpeed reports an unreadable config itself
            if enabled:
                raise TencacheError('the DeepSpeed config enables "tencache", but tencache_ds could not install its '
                                    f"swappers when DeepSpeed was imported: {install_error!r}") from install_error
        return original(*args, **kwargs)

    deepspeed.initialize = initialize
