"""tencache_ds: tensor caching and migration for DeepSpeed ZeRO-3 / ZeRO-Infinity offload.

A training script needs only ``import tencache_ds`` and a top-level ``"tencache": {...}`` block in its DeepSpeed
config: importing the package puts tencache's swappers where DeepSpeed looks them up (as soon as DeepSpeed is
imported, before or after this package), and they fall back to stock DeepSpeed for any config without an enabled
block. ``tencache_ds.initialize`` wraps ``deepspeed.initialize``; ``tencache_ds.stats(engine)`` reports memory and
I/O. Importing this package does not import DeepSpeed or initialise CUDA by itself.
"""
import importlib.abc
import importlib.machinery
import os
import sys

from .config import NO_AUTO_INSTALL_ENV, TencacheConfig, parse_config
from .errors import (StaleFileError, TencacheConfigError, TencacheError, TencacheOutOfMemory,
                     TencacheResourceError)

__version__ = "0.1.0"
__all__ = ["install", "uninstall", "initialize", "stats", "TencacheConfig", "parse_config", "TencacheError",
           "TencacheConfigError", "TencacheResourceError", "TencacheOutOfMemory", "StaleFileError"]


def install() -> None:
    """Put tencache's swappers in DeepSpeed (imports DeepSpeed). Idempotent; done automatically on import."""
    from .integrations.deepspeed.install import install as _install
    _install()


def uninstall() -> None:
    """Give DeepSpeed its own swappers back for models built from now on."""
    from .integrations.deepspeed.install import uninstall as _uninstall
    _uninstall()


def initialize(*args, **kwargs):
    """``deepspeed.initialize`` with tencache installed first; same arguments, same return value."""
    from .integrations.deepspeed.install import initialize as _initialize
    return _initialize(*args, **kwargs)


def stats(engine) -> dict:
    """A flat dict about ``engine``'s swappers: pinned_bytes_reserved, pinned_bytes_peak_in_use, nvme_read_bytes,
    nvme_write_bytes, stock_pinned_bytes_estimate (what stock DeepSpeed locks for the same config), and more."""
    from .integrations.deepspeed.stats import engine_stats
    return engine_stats(engine)


class _InstallAfterDeepSpeedImport(importlib.abc.MetaPathFinder):
    """Runs install() right after the top-level ``deepspeed`` package finishes importing, so that
    ``import tencache_ds`` stays cheap (the CLI, the planner) and still activates for training scripts.

    A look-up is not an import: transformers and accelerate call ``importlib.util.find_spec("deepspeed")`` to
    see whether it is there. So the hook stays in place until DeepSpeed's module actually executes, and asks the
    other finders for the spec (whatever installed DeepSpeed: site-packages, an editable install, a zip)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "deepspeed":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original_exec, hook = spec.loader.exec_module, self

        def exec_module(module):
            original_exec(module)
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
            try:
                if os.environ.get(NO_AUTO_INSTALL_ENV) == "1":
                    _refuse_until_installed()
                else:
                    install()
            except Exception as err:  # never break `import deepspeed` because of us ...
                if _install_module_is_being_imported():
                    return  # the adapters' own import is what imported DeepSpeed: it installs when it finishes
                _refuse_tencache_configs(err)  # ... but never run stock where a config asks for tencache

        spec.loader.exec_module = exec_module
        return spec


_INSTALL_MODULE = __name__ + ".integrations.deepspeed.install"


def _install_module_is_being_imported() -> bool:
    module = sys.modules.get(_INSTALL_MODULE)
    spec = getattr(module, "__spec__", None)
    return module is not None and getattr(spec, "_initializing", False)


def _refuse_tencache_configs(err: Exception) -> None:
    """The swappers could not be installed: say so, and make ``deepspeed.initialize`` refuse configs that enable
    tencache (integrations/deepspeed/refusal.py) instead of letting them train stock."""
    import warnings
    warnings.warn(f"tencache_ds could not install its swappers ({err!r}); DeepSpeed runs stock, and a config with "
                  f'an enabled "tencache" block will be refused')
    from .integrations.deepspeed.refusal import refuse_tencache_configs
    refuse_tencache_configs(f"tencache_ds could not install its swappers when DeepSpeed was imported: {err!r}", err)


def _refuse_until_installed() -> None:
    """NO_AUTO_INSTALL_ENV set: until tencache_ds.install(), a config that enables tencache is refused."""
    from .integrations.deepspeed.refusal import refuse_until_installed
    refuse_until_installed()


if "deepspeed" in sys.modules:
    if os.environ.get(NO_AUTO_INSTALL_ENV) == "1":
        _refuse_until_installed()
    else:
        install()
elif not any(isinstance(finder, _InstallAfterDeepSpeedImport) for finder in sys.meta_path):
    sys.meta_path.insert(0, _InstallAfterDeepSpeedImport())
