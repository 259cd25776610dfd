"""Byte sizes as users write them ("4GiB", 1e9, "auto") and as we print them. Leaf module: no torch."""
import math
import mmap
import os
import re
from fractions import Fraction

_UNIT_BYTES = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

PAGE_BYTES = 4096  # O_DIRECT-safe alignment for addresses, sizes and file offsets
# The kernel's page: what mmap hands out and mlock, munlock, madvise and the page cache act on whole (4 KiB on x86,
# often 64 KiB on arm64), never below PAGE_BYTES
HOST_PAGE_BYTES = max(PAGE_BYTES, mmap.PAGESIZE)
# Sets the arena's page (arena_page_bytes) in tests: 64 KiB pages' arithmetic on a 4 KiB machine
ARENA_PAGE_ENV = "TENCACHE_ARENA_PAGE_BYTES"
# the largest byte size read: what a signed 64-bit count holds (torch's sizes, the kernel's offsets); "1e400" is a typo
MAX_BYTES = (1 << 63) - 1
_MAX_EXPONENT = 30  # of a size's decimal exponent: past MAX_BYTES whatever the digits before it (or below a byte)


def arena_page_bytes() -> int:
    """The unit the kernel locks, unlocks and gives back (mlock, munlock, madvise act on whole pages): 4 KiB on
    x86, often 64 KiB on arm64 (Grace). The arena's slots are whole pages of it (memory/arena.py), so the stores
    plan their size classes in it too: a class planned in 4 KiB units was not the arena's, and every lookup of its
    slots by that size failed (helper-235: KeyError at the first forward where the pages are 64 KiB)."""
    forced = os.environ.get(ARENA_PAGE_ENV)
    if forced:
        from .errors import TencacheConfigError  # (a leaf too; imported where it is raised)
        try:
            page = int(forced)
        except ValueError:
            raise TencacheConfigError(f"{ARENA_PAGE_ENV}={forced!r}: a power of two of at least 4096, in bytes") \
                from None
        if page < 4096 or page & (page - 1):
            raise TencacheConfigError(f"{ARENA_PAGE_ENV}={forced}: a power of two of at least 4096")
        return page
    return HOST_PAGE_BYTES


def parse_bytes(value) -> int:
    """Parse ``value`` into a number of bytes.

    Accepts an int, a float that is a whole number (``1e9``), or a string with an optional unit
    (``"512MiB"``, ``"1.5GB"``, ``"2e9"``), read exactly: "4.1GB" is 4,100,000,000 bytes (in binary floating point
    4.1 x 10^9 came out 5e-7 of a byte short of a whole number, and was refused as one). Raises ValueError naming
    the value otherwise.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size, got a boolean {value!r}")
    if isinstance(value, int):
        number, unit = value, ""
    elif isinstance(value, float):
        number, unit = value, ""
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if not match:
            raise ValueError(f"cannot read {value!r} as a byte size (examples: 1073741824, \"1GiB\", \"512MB\")")
        exponent = re.search(r"[eE]([+-]?[0-9]+)$", match.group(1))
        if exponent is not None and abs(int(exponent.group(1))) > _MAX_EXPONENT:  # (an exact 10^999999999 is slow)
            raise ValueError(f"a byte size must be at most {MAX_BYTES} (2^63 - 1): {value!r}"
                             if int(exponent.group(1)) > 0 else f"a byte size must be a whole number of bytes: "
                             f"{value!r}")
        number, unit = Fraction(match.group(1)), match.group(2).lower()
        if unit not in _UNIT_BYTES:
            raise ValueError(f"unknown unit {match.group(2)!r} in {value!r} (use B, KB, MB, GB, KiB, MiB, GiB, TiB)")
    else:
        raise ValueError(f"expected a byte size, got {type(value).__name__} {value!r}")
    nbytes = number * _UNIT_BYTES[unit]
    if not finite(nbytes):  # float("inf"), NaN
        raise ValueError(f"a byte size must be a finite number: {value!r}")
    if nbytes < 0:
        raise ValueError(f"a byte size cannot be negative: {value!r}")
    if nbytes > MAX_BYTES:
        raise ValueError(f"a byte size must be at most {MAX_BYTES} (2^63 - 1): {value!r}")
    if nbytes != int(nbytes):
        raise ValueError(f"a byte size must be a whole number of bytes: {value!r}")
    return int(nbytes)


def finite(number) -> bool:
    """Whether a JSON number is finite as a float: JSON readers take NaN and Infinity, read 1e400 as infinity, and
    an integer past float's range (10**400) raises OverflowError where it meets float arithmetic."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def fmt_bytes(nbytes: float) -> str:
    """Human form with binary units, e.g. 1536 -> '1.50 KiB'."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def round_up(nbytes: int, alignment: int = PAGE_BYTES) -> int:
    """Round ``nbytes`` up to a multiple of ``alignment``, e.g. 5000 -> 8192 for 4 KiB."""
    return -(-nbytes // alignment) * alignment
