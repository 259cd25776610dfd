"""When tencache's swappers could not be installed. Owns: refusing, at ``deepspeed.initialize``, a config that
enables tencache, so such a run fails with the install error instead of silently training stock DeepSpeed.
Imports only DeepSpeed, tencache's config and config_source.py, the block's reader (the rest of the adapters may be
what failed)."""
import inspect

import deepspeed

from ...errors import TencacheConfigError, TencacheError
from .config_source import ds_config_of_initialize_call, tencache_config


def refuse_tencache_configs(install_error: Exception) -> None:
    original = deepspeed.initialize
    signature = inspect.signature(original)

    def initialize(*args, **kwargs):
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
            ds_config = ds_config_of_initialize_call(bound)
        except (TypeError, ValueError, TencacheError):
            ds_config = None  # DeepSpeed reports a bad call or an unreadable config itself
        try:
            enabled = tencache_config(ds_config).enabled
        except TencacheConfigError as err:  # a block there, but not a valid one: it asked for tencache
            raise TencacheError(f"{err}; besides, tencache_ds could not install its swappers when DeepSpeed was "
                                f"imported: {install_error!r}") from install_error
        if enabled:
            raise TencacheError('the DeepSpeed config enables "tencache", but tencache_ds could not install its '
                                f"swappers when DeepSpeed was imported: {install_error!r}") from install_error
        return original(*args, **kwargs)

    deepspeed.initialize = initialize
