"""When tencache's swappers are not in DeepSpeed: they could not be installed, were kept out
(``TENCACHE_NO_AUTO_INSTALL=1``) or taken out (``uninstall``). Owns: refusing, at ``deepspeed.initialize``, a config
that enables tencache, so such a run fails saying why instead of silently training stock DeepSpeed; and where a name
bound to the refusal is called once tencache is installed, handing the call to tencache's own initialize. Imports only
DeepSpeed, tencache's config, zero_sections (a block misplaced or misspelled) and config_source.py, the block's reader
(the rest of the adapters may be what failed)."""
import contextlib
import inspect
import threading
from typing import Optional

import deepspeed

from ...config import NO_AUTO_INSTALL_ENV
from ...errors import TencacheConfigError, TencacheError
from ...zero_sections import reject_nested_blocks
from .config_source import ds_config_of_initialize_call, tencache_config

NOT_INSTALLED = (f"{NO_AUTO_INSTALL_ENV}=1 kept tencache's swappers out of DeepSpeed: call tencache_ds.install() (or "
                 f"use tencache_ds.initialize) first, or remove the block to train stock DeepSpeed")
_REFUSING = "_tencache_refusal_of"  # on a refusing initialize: the deepspeed.initialize it stands before
_installed = {"initialize": None}  # tencache's own initialize while installed (install.py: installed_as)
_calls = threading.local()  # the config arguments of tencache's initialize calls running on this thread


def installed_as(initialize) -> None:
    """install() put ``initialize`` in DeepSpeed (None: uninstall() took it out): a refusal bound before hands its
    calls to it."""
    _installed["initialize"] = initialize


@contextlib.contextmanager
def installed_call(config_arguments: tuple):
    """While tencache's own initialize runs with ``config_arguments`` (``config_arguments_of``): the refusal reached
    from inside it with those same arguments (its wrapped DeepSpeed initialize is a user's wrapper around the refusal,
    or a name bound early) passes the call to DeepSpeed; a nested initialize of another config does not."""
    stack = getattr(_calls, "stack", None)
    if stack is None:
        stack = _calls.stack = []
    stack.append(config_arguments)
    try:
        yield
    finally:
        stack.pop()


def config_arguments_of(bound: dict) -> tuple:
    """The arguments a ``deepspeed.initialize`` call's config comes from (config_source.py reads the same)."""
    return tuple(bound.get(name) for name in ("args", "config", "config_params"))


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
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            bound = {}  # DeepSpeed reports a bad call itself
        running = getattr(_calls, "stack", None)
        if running and all(a is b for a, b in zip(running[-1], config_arguments_of(bound))):
            return original(*args, **kwargs)  # tencache's initialize of this very call led here: DeepSpeed's own
        if _installed["initialize"] is not None:  # a name bound early, called after install(): tencache's (not the
            return _installed["initialize"](*args, **kwargs)  # current deepspeed.initialize: a wrapper may loop)
        try:
            ds_config = ds_config_of_initialize_call(bound)
        except (TypeError, ValueError, TencacheError):
            ds_config = None  # DeepSpeed reports a bad call or an unreadable config itself
        try:
            if isinstance(ds_config, dict):  # a block misplaced or misspelled asks for tencache too (helper-206)
                reject_nested_blocks(ds_config)
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
