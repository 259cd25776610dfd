"""Putting tencache's swappers where DeepSpeed looks them up. Owns: the name rebinding and its undo, and the
config check at ``deepspeed.initialize``.

DeepSpeed builds its swappers by module-global name at call time (deepspeed-integration.md, b):
``partition_parameters.AsyncPartitionedParameterSwapper`` in zero.Init, and ``stage3.PartitionedOptimizerSwapper``
/ ``stage3.PipelinedOptimizerSwapper`` in the ZeRO-3 optimizer. Rebinding those names reaches every path that
builds ZeRO-3 parameters: a user's zero.Init, Hugging Face's from_pretrained/from_config under ZeRO-3, and the
engine's own conversion of a model built outside zero.Init. Our classes return the stock ones when a config has
no enabled "tencache" block, so installing changes nothing for such runs.

``deepspeed.initialize`` is wrapped too, to validate the config before DeepSpeed reads it: a block that can
never take effect (ZeRO stage 1/2, or nothing offloaded to NVMe) means no swapper is ever built, so without this
check the run would silently be stock DeepSpeed; and our message for a block misplaced inside
"zero_optimization" comes before DeepSpeed's pydantic one.
"""
import functools
import inspect
import threading

import deepspeed
import deepspeed.runtime.zero.partition_parameters as _partition_parameters
import deepspeed.runtime.zero.stage3 as _stage3

from ...ext_lock import raise_if_stale_locks
from .config_bridge import DEEPSPEED_OPS, ds_config_of_initialize_call, validate_ds_config
from .optimizer_swapper import TencacheOptimizerSwapper
from .param_swapper import TencacheParamSwapper


def _validating(initialize):
    signature = inspect.signature(initialize)

    @functools.wraps(initialize)
    def validating_initialize(*args, **kwargs):
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:  # DeepSpeed reports a bad call itself
            bound = {}
        if validate_ds_config(ds_config_of_initialize_call(bound)).enabled:
            raise_if_stale_locks(ops=DEEPSPEED_OPS)  # cpu_adam loads below, before any swapper exists
        return initialize(*args, **kwargs)

    return validating_initialize


def _closing_swappers(destroy):
    @functools.wraps(destroy)
    def destroy_and_close_swappers(self, *args, **kwargs):
        try:
            return destroy(self, *args, **kwargs)
        finally:
            close_swappers_of(self)

    return destroy_and_close_swappers


def close_swappers_of(optimizer) -> None:
    """Close the tencache swappers a ZeRO-3 optimizer used: its optimizer swapper, and its parameters' swappers
    once no other zero.Init model uses them (stock DeepSpeed leaves its swappers to the garbage collector; ours
    hold I/O threads, pinned memory and host-tier bytes, which a rebuilt engine in the same process needs)."""
    swapper = getattr(optimizer, "optimizer_swapper", None)
    if isinstance(swapper, TencacheOptimizerSwapper):
        swapper.close()
    param_swappers = {}
    for group in getattr(optimizer, "fp16_groups", None) or []:
        for param in group:
            candidate = getattr(param, "nvme_swapper", None)
            if isinstance(candidate, TencacheParamSwapper):
                param_swappers[id(candidate)] = candidate
    for candidate in param_swappers.values():
        candidate.release_user()


_REBINDINGS = (
    (_partition_parameters, "AsyncPartitionedParameterSwapper", TencacheParamSwapper),
    (_stage3, "PartitionedOptimizerSwapper", TencacheOptimizerSwapper),
    (_stage3, "PipelinedOptimizerSwapper", TencacheOptimizerSwapper),
    # `deepspeed.initialize` is looked up at call time by user scripts, Hugging Face's Trainer and Accelerate.
    (deepspeed, "initialize", _validating(deepspeed.initialize)),
    # engine.destroy() -> optimizer.destroy(): our swappers are closed with the engine.
    (_stage3.DeepSpeedZeroOptimizer_Stage3, "destroy", _closing_swappers(_stage3.DeepSpeedZeroOptimizer_Stage3.destroy)),
)
_originals = {}
_lock = threading.Lock()


def install() -> None:
    """Rebind DeepSpeed's swapper names to tencache's classes. Idempotent."""
    with _lock:
        for module, name, ours in _REBINDINGS:
            current = getattr(module, name)
            if current is not ours:
                _originals[(module.__name__, name)] = current
                setattr(module, name, ours)


def uninstall() -> None:
    """Restore DeepSpeed's own classes (for tests and for users who want stock back in-process)."""
    with _lock:
        for module, name, _ours in _REBINDINGS:
            original = _originals.pop((module.__name__, name), None)
            if original is not None:
                setattr(module, name, original)


def initialize(*args, **kwargs):
    """``deepspeed.initialize`` after install(); same arguments, same return value."""
    install()
    return deepspeed.initialize(*args, **kwargs)


def is_installed() -> bool:
    return all(getattr(module, name) is ours for module, name, ours in _REBINDINGS)
