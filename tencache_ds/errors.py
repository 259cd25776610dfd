"""The error classes of tencache_ds. Owns: what kinds of failure a user can see. Does not own: messages.

Three kinds of failure are kept apart (see ../shared/design/style.md, 8.4):
- bad configuration or input  -> TencacheConfigError (a ValueError), raised before anything is touched;
- an expected resource limit  -> TencacheResourceError (memory, memlock, disk space, unwritable path),
  always with the quantity, the limit and the key or command that controls it;
- a broken internal invariant -> plain ``assert`` inside the library.
"""


class TencacheError(Exception):
    """Base class of every error tencache_ds raises on purpose."""


class TencacheConfigError(TencacheError, ValueError):
    """The "tencache" block, or the DeepSpeed config it goes with, asks for something invalid."""


class TencacheResourceError(TencacheError, RuntimeError):
    """The machine cannot give what the run needs (memory, locked memory, disk space, a writable path)."""


class TencacheOutOfMemory(TencacheResourceError, MemoryError):
    """A memory budget or the host's memory is too small for what the plan needs."""


class StaleFileError(TencacheError, RuntimeError):
    """A persisted profile or swap file does not belong to this model/config (wrong fingerprint or size)."""
