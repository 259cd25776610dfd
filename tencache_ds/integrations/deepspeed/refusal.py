"""When tencache's swappers are not in DeepSpeed: they could not be installed, were kept out
(``TENCACHE_NO_AUTO_INSTALL=1``) or taken out (``uninstall``). Owns: refusing, at ``deepspeed.initialize``, a config
that enables tencache, so such a run fails saying why instead of silently training stock DeepSpeed. Imports only
DeepSpeed, tencache's config and config_source.py, the block's reader (the rest of the adapters may be what failed)."""
import contextlib
import inspect
import threading
from typing import Optional

import deepspeed

from ...config import NO_AUTO_INSTALL_ENV
from ...errors import TencacheConfigError, TencacheError
from .config_source import ds_config_of_initialize_call, tencache_config

NOT_INSTALLED = (f"{NO_AUTO_INSTALL_ENV}=1 kept tencache's swappers out of DeepSpeed: call tencache_ds.install() (or "
                 f"use tencache_ds.initialize) first, or remove the block to train stock DeepSpeed")
_REFUSING = "_tencache_refusal_of"  # on a refusing initialize: the deepspeed.initialize it stands before
INSTALLED = "_tencache_installed"  # on tencache's own initialize (install.py)
_in_installed = threading.local()  # depth of tencache's own initialize calls on this thread


@contextlib.contextmanager
def installed_call():
    """While tencache's own initialize runs (install.py): a refusal reached from inside it (a name bound early, a
    user's wrapper around the refusal that install() then wrapped) is passed through, not refused nor handed back."""
    _in_installed.depth = getattr(_in_installed, "depth", 0) + 1
    try:
        yield
    finally:
        _in_installed.depth -= 1


def unrefused(initialize):
    """The ``deepspeed.initialize`` a refusal stands before, or ``initialize`` itself (install.py wraps that one)."""
    return getattr(initialize, _REFUSING, initialize)


def refuse_tencache_configs(why: str, cause: Optional[BaseException] = None) -> None:
    """From now on ``deepspeed.initialize`` refuses a config that enables tencache, the message ending in ``why``
    (install() puts its own initialize in its place, and uninstall() puts this one back). A second call replaces the
    first's reason instead of stacking a second refusal."""
    original = unrefused(deepspeed.initialize)
    signature = inspect.signature(original)

    def initialize(*args, **kwargs):
        if getattr(_in_installed, "depth", 0):  # tencache's initialize is what called this: DeepSpeed's own
            return original(*args, **kwargs)
        current = deepspeed.initialize
        if getattr(current, INSTALLED, False):  # a name bound early, called after install(): tencache's (only that:
            return current(*args, **kwargs)  # any other wrapper may call back here, forever: helper-167's review)
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
            ds_config = ds_config_of_initialize_call(bound)
        except (TypeError, ValueError, TencacheError):
            ds_config = None  # DeepSpeed reports a bad call or an unreadable config itself
        try:
            enabled = tencache_config(ds_config).enabled
        except TencacheConfigError as err:  # a block there, but not a valid one: it asked for tencache
            raise TencacheError(f"{err}; besides, {why}") from cause
        if enabled:
            raise TencacheError(f'the DeepSpeed config enables "tencache", but {why}') from cause
        return original(*args, **kwargs)

    setattr(initialize, _REFUSING, original)
    deepspeed.initialize = initialize


def refuse_until_installed() -> None:
    """``NO_AUTO_INSTALL_ENV`` kept the swappers out (until 2026-12-07 such a config trained stock: helper-161)."""
    refuse_tencache_configs(NOT_INSTALLED)
