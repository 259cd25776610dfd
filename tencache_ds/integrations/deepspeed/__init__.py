"""The DeepSpeed adapters: the only package that imports DeepSpeed.

DeepSpeed is imported here, first: importing it runs tencache's install hook (tencache_ds/__init__.py), which
imports every adapter module. Had an adapter module's own import been the first to import DeepSpeed, the hook
would find that module half-initialised and the install would fail."""
import deepspeed  # noqa: F401  (for its import hook, see above)
