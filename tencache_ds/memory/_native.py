"""ctypes binding of the native arena (csrc/arena.c, built into tencache_ds/_tencache_arena*.so by setup.py).

Owns: finding and loading the library, the ctypes mirrors of the C structs, the argtypes/restypes, the
TC_* codes. Does not own: turning codes into exceptions or anything a caller sees (memory/arena.py).

The library is loaded once, on first use; a failure is remembered, logged at warning level, and reported by
native_unavailable_reason(). ctypes releases the GIL during each call, so threads really run the C mutex.
"""
import ctypes
import importlib.util
import logging
import os
import threading
from typing import Optional

logger = logging.getLogger(__name__)

MODULE_NAME = "tencache_ds._tencache_arena"
ABI_VERSION = 2  # = TC_ARENA_ABI_VERSION in csrc/include/tencache/arena.h

# Error codes (enum in arena.h).
TC_OK = 0
TC_EINVAL = 1
TC_ENOMEM = 2
TC_ELOCK = 3
TC_EEMPTY = 4
TC_ENOTOWNED = 5
TC_ERELEASE = 6

# Lock modes, by the names the Python API and the config use.
LOCK_MODES = {"off": 0, "best_effort": 1, "required": 2}

BUILD_HINT = ("build it with `pip install -e .` (needs a C compiler, e.g. gcc) or, for a checkout, "
              "`python setup.py build_ext --inplace`; make sure TENCACHE_BUILD_NATIVE is not set to 0")


class TcClassSpec(ctypes.Structure):
    _fields_ = [("slot_bytes", ctypes.c_uint64), ("slot_count", ctypes.c_uint64)]


class TcStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "reserved", "locked", "in_use", "peak_in_use", "requested_in_use", "allocs", "frees", "failed_allocs",
        "lock_fallbacks", "n_regions", "n_classes", "retired")]


class TcClassStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "slot_bytes", "slot_count", "slots_in_use", "peak_slots_in_use", "locked", "slots_retired")]


_arena_p = ctypes.c_void_p  # opaque tc_arena_t*

_SIGNATURES = {
    "tc_arena_create": (ctypes.c_int, [ctypes.POINTER(TcClassSpec), ctypes.c_uint32, ctypes.c_int,
                                       ctypes.POINTER(_arena_p)]),
    "tc_arena_alloc": (ctypes.c_int, [_arena_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.POINTER(ctypes.c_uint32)]),
    "tc_arena_free": (ctypes.c_int, [_arena_p, ctypes.c_void_p]),
    "tc_arena_retire": (ctypes.c_int, [_arena_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)]),
    "tc_arena_restore": (ctypes.c_int, [_arena_p, ctypes.c_uint32, ctypes.c_uint64,
                                        ctypes.POINTER(ctypes.c_uint64)]),
    "tc_arena_stats": (ctypes.c_int, [_arena_p, ctypes.POINTER(TcStats)]),
    "tc_arena_class_stats": (ctypes.c_int, [_arena_p, ctypes.c_uint32, ctypes.POINTER(TcClassStats)]),
    "tc_arena_region": (ctypes.c_int, [_arena_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_uint64)]),
    "tc_arena_validate": (ctypes.c_int, [_arena_p]),
    "tc_arena_destroy": (None, [_arena_p]),
    "tc_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "tc_arena_abi_version": (ctypes.c_uint32, []),
}

_load_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_unavailable_reason: Optional[str] = None
_tried = False


def native_build_disabled() -> bool:
    """True when TENCACHE_BUILD_NATIVE turns the native build off (same values as setup.py)."""
    return os.environ.get("TENCACHE_BUILD_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


def _load() -> ctypes.CDLL:
    if native_build_disabled():
        hint = " (TENCACHE_BUILD_NATIVE turns the build off here; if it did at install time too, it was skipped)"
    else:
        hint = ""
    spec = importlib.util.find_spec(MODULE_NAME)
    if spec is None or not spec.origin:
        raise OSError(f"{MODULE_NAME} is not built{hint}")
    lib = ctypes.CDLL(spec.origin)
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    version = lib.tc_arena_abi_version()
    if version != ABI_VERSION:
        raise OSError(f"{spec.origin} has ABI version {version}, this Python code expects {ABI_VERSION}: "
                      "the build is stale")
    return lib


def lib() -> ctypes.CDLL:
    """The loaded library. Raises OSError with the reason (see native_unavailable_reason) if it cannot load."""
    global _lib, _unavailable_reason, _tried
    with _load_lock:
        if not _tried:
            _tried = True
            try:
                _lib = _load()
            except (OSError, AttributeError, ImportError) as exc:
                _unavailable_reason = f"{exc}; {BUILD_HINT}"
                logger.warning("tencache native arena unavailable: %s", _unavailable_reason)
    if _lib is None:
        raise OSError(_unavailable_reason)
    return _lib


def native_available() -> bool:
    """True if the native arena library is built and loads."""
    try:
        lib()
    except OSError:
        return False
    return True


def native_unavailable_reason() -> Optional[str]:
    """Why the native arena cannot be used (with how to build it), or None when it can."""
    try:
        lib()
    except OSError:
        return _unavailable_reason
    return None


def strerror(code: int) -> str:
    """The library's description of a TC_* code."""
    return lib().tc_strerror(code).decode()
