"""PinnedArena: page-locked host buffers in fixed size classes, for NVMe <-> host <-> GPU transfers.

Owns: the Python API over the native arena (csrc/arena.c; see Note [Pinned arena design] there): argument
checks, TC_* codes -> exceptions with the numbers, the memlock messages, CUDA registration of the regions
(through pinning.py), zero-copy tensor views over slots. Does not own: choosing the size classes (plan/) or
what to do when no slot fits (the caller: wait, evict or fall back).
"""
import ctypes
import logging
import resource
import warnings
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ..errors import TencacheConfigError, TencacheOutOfMemory, TencacheResourceError
from ..probes.limits import locked_bytes_now
from ..units import ARENA_PAGE_ENV, arena_page_bytes, fmt_bytes, round_up
from . import _native, pinning

if TYPE_CHECKING:  # torch is imported only when a tensor view is asked for
    import torch

logger = logging.getLogger(__name__)
# Forces the page size slots are aligned to (a power of two of at least 4096): a 64 KiB-page kernel in tests.
PAGE_ENV = ARENA_PAGE_ENV  # (its home: units.py, where the stores read the page size too)
MEMLOCK_RAISE = "raise it with `ulimit -l unlimited`, or --ulimit memlock=-1 in docker"
MEMLOCK_FIX = MEMLOCK_RAISE + ", or set \"tencache\": {\"pin_memory\": \"best_effort\"}"


class ArenaSlot:
    """One slot handed out by a PinnedArena.

    ``ptr`` is the slot's address; it and ``slot_bytes`` are multiples of 4096 (O_DIRECT safe), and
    ``nbytes <= slot_bytes`` is what was asked for. ``size_class`` is the class index (ascending slot size),
    ``locked`` whether the slot's region is page-locked. The contents are NOT zeroed. The slot is valid until
    ``PinnedArena.free(slot)`` or ``PinnedArena.close()``; tensors from ``as_tensor`` must not be used after.
    """

    __slots__ = ("ptr", "nbytes", "slot_bytes", "size_class", "locked", "_arena", "_live")

    def __init__(self, arena: "PinnedArena", ptr: int, nbytes: int, slot_bytes: int, size_class: int,
                 locked: bool):
        self.ptr = ptr
        self.nbytes = nbytes
        self.slot_bytes = slot_bytes
        self.size_class = size_class
        self.locked = locked
        self._arena = arena  # keeps the arena (and so the mapping) alive while the slot object exists
        self._live = True    # False once freed: a stale handle must not free the slot's next owner

    @property
    def arena(self) -> "PinnedArena":
        """The arena that handed this slot out (and that ``free`` takes it back)."""
        return self._arena

    def as_tensor(self, dtype: "torch.dtype", numel: int) -> "torch.Tensor":
        """A 1-D ``torch.Tensor`` of ``numel`` elements of ``dtype`` over the slot's memory (no copy).

        The tensor keeps the arena object alive, so garbage collection never unmaps memory under a live view;
        an explicit ``close()`` or ``free()`` still does, and the caller must drop such views first.

        Raises:
            ValueError: ``numel * dtype.itemsize`` exceeds ``slot_bytes``, or the slot was freed.
        """
        import torch
        if not self._live:
            raise ValueError(f"slot 0x{self.ptr:x} was freed")
        if numel < 0 or numel * dtype.itemsize > self.slot_bytes:
            raise ValueError(f"{numel} x {dtype} ({numel * dtype.itemsize} bytes) does not fit a slot of "
                             f"{self.slot_bytes} bytes")
        buffer = (ctypes.c_uint8 * self.slot_bytes).from_address(self.ptr)
        buffer._tencache_arena = self._arena  # torch.frombuffer holds `buffer`; `buffer` holds the arena
        return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype)[:numel]

    def __repr__(self) -> str:
        return (f"ArenaSlot(ptr=0x{self.ptr:x}, nbytes={self.nbytes}, slot_bytes={self.slot_bytes}, "
                f"size_class={self.size_class}, locked={self.locked}{'' if self._live else ', freed'})")


class PinnedArena:
    """Fixed size classes of page-locked, page-aligned host slots, with O(1) alloc/free (native code).

    Invariants (checked by ``validate()``): every slot address and ``slot_bytes`` is a multiple of the page
    (``units.arena_page_bytes``, at least 4096); a
    slot is handed out at most once until freed; ``in_use_bytes`` is the sum of ``slot_bytes`` of the live
    slots and ``requested_in_use_bytes`` the sum of their ``nbytes`` (the difference is size-class waste);
    ``locked_bytes <= reserved_bytes``. alloc/free/stats are thread-safe; close() must not race with them.

    Args:
        class_counts: slot_bytes -> number of slots. Sizes are rounded up to a whole number of pages (4096
            bytes at least); sizes equal after rounding are merged. At most 64 classes.
        lock: "off" (never mlock), "best_effort" (mlock; regions that cannot be locked stay pageable, with
            one warning) or "required" (raise if any region cannot be locked).
        register_with_cuda: register every region with cudaHostRegister when CUDA is available, so slot
            tensors are pinned (``is_pinned()``) and H2D/D2H copies are asynchronous.
        name: used in messages and warnings.
        too_large_remedy: what the message of a region that cannot be mapped advises (default: a smaller
            host_cache_bytes, which sizes the cache's regions).

    Raises:
        TencacheConfigError: bad ``class_counts`` or ``lock``.
        TencacheResourceError: the native library is not built, or lock="required" and mlock failed.
        TencacheOutOfMemory: the regions could not be mapped.
    """

    def __init__(self, class_counts: Dict[int, int], lock: str = "best_effort", register_with_cuda: bool = True,
                 name: str = "arena", too_large_remedy: Optional[str] = None):
        self._handle: Optional[int] = None  # first, so close() and __del__ work whatever fails below
        self._registered: List[Tuple[int, int]] = []
        self.name = name
        _check_class_counts(class_counts)
        class_counts = _whole_pages(class_counts)
        if lock not in _native.LOCK_MODES:
            raise TencacheConfigError(f"{name}: lock must be one of {sorted(_native.LOCK_MODES)}, got {lock!r}")
        try:
            self._lib = _native.lib()
        except OSError as exc:
            raise TencacheResourceError(f"{name}: the native arena library is not available: {exc}") from None
        reserved = sum(round_up(slot_bytes) * count for slot_bytes, count in class_counts.items())
        specs = (_native.TcClassSpec * len(class_counts))(
            *[_native.TcClassSpec(slot_bytes, count) for slot_bytes, count in class_counts.items()])
        handle = ctypes.c_void_p()
        try:
            code = self._lib.tc_arena_create(specs, len(class_counts), _native.LOCK_MODES[lock], ctypes.byref(handle))
        finally:  # made (set only on success): close() unmaps it, whatever comes next (a Ctrl-C raised as the call
            self._handle = handle.value  # returned left the regions mapped and locked, unreachable: helper-224)
        if code == _native.TC_ELOCK:
            raise TencacheResourceError(_memlock_message(name, reserved, "could not page-lock (mlock)", MEMLOCK_FIX))
        if code == _native.TC_ENOMEM:
            raise TencacheOutOfMemory(
                f"{name}: could not map {fmt_bytes(reserved)} ({reserved} bytes) of host memory (mmap failed) in "
                f"slots of {', '.join(fmt_bytes(size) for size in sorted(class_counts, reverse=True))}; " +
                (too_large_remedy or "lower \"tencache\": {\"host_cache_bytes\": ...} or free host memory"))
        if code != _native.TC_OK:
            raise TencacheConfigError(f"{name}: tc_arena_create({class_counts}) failed: {_native.strerror(code)}")

        self._classes: List[Tuple[int, int]] = []
        self._class_locked: List[bool] = []
        for cls in range(self._native_stats().n_classes):
            c = self._class_stats(cls)
            self._classes.append((c.slot_bytes, c.slot_count))
            self._class_locked.append(bool(c.locked))
        stats = self._native_stats()
        if stats.lock_fallbacks:
            unlocked = stats.reserved - stats.locked
            warnings.warn(_memlock_message(
                name, unlocked, f"{stats.lock_fallbacks} of {stats.n_regions} regions stay pageable (slower, "
                "swappable): could not page-lock (mlock)", MEMLOCK_RAISE), RuntimeWarning, stacklevel=2)
        if register_with_cuda and pinning.cuda_available():
            pinning.register_regions(self.regions(), name, into=self._registered)  # each as it is: close() undoes

    # -- slots ------------------------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> Optional[ArenaSlot]:
        """A slot of the smallest class that fits ``nbytes`` and has a free slot (not zeroed), or None if
        there is none (the caller decides: wait, evict or fall back). O(number of classes).

        Raises:
            ValueError: ``nbytes`` is not a positive int, or the arena is closed.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 < nbytes < 2**64:
            raise ValueError(f"{self.name}: nbytes must be a positive int, got {nbytes!r}")
        ptr, cls = ctypes.c_void_p(), ctypes.c_uint32()
        code = self._lib.tc_arena_alloc(self._live_handle(), nbytes, ctypes.byref(ptr), ctypes.byref(cls))
        if code == _native.TC_EEMPTY:
            return None
        assert code == _native.TC_OK, _native.strerror(code)  # nbytes was checked above
        return ArenaSlot(self, ptr.value, nbytes, self._classes[cls.value][0], cls.value,
                         self._class_locked[cls.value])

    def free(self, slot: ArenaSlot) -> None:
        """Give ``slot`` back; its memory (and any tensor over it) may be handed out again at once.

        Raises:
            ValueError: ``slot`` was already freed, was not handed out by this arena, or the arena is closed.
        Freeing one ArenaSlot object from two threads at once is a caller bug the check may miss.
        """
        if not isinstance(slot, ArenaSlot):
            raise ValueError(f"{self.name}: expected an ArenaSlot, got {type(slot).__name__}")
        if not slot._live:
            raise ValueError(f"{self.name}: double free of {slot!r}")
        code = self._lib.tc_arena_free(self._live_handle(), slot.ptr)
        if code == _native.TC_ENOTOWNED:
            raise ValueError(f"{self.name}: {slot!r} was not handed out by this arena (or was already freed)")
        assert code == _native.TC_OK, _native.strerror(code)
        slot._live = False

    # -- giving memory back -----------------------------------------------------------------------------

    @property
    def can_retire(self) -> bool:
        """False when the regions are registered with CUDA: the driver holds its own references to their pages, so
        dropping them would free nothing and leave device copies reading other pages than the host writes."""
        return not self._registered

    def retire(self, size_class: int, count: int) -> int:
        """Give up to ``count`` free slots of class index ``size_class`` back to the kernel (unlocked, pages
        dropped; the addresses stay reserved). Returns how many; 0 when ``can_retire`` is False."""
        if count <= 0 or not self.can_retire:
            return 0
        done = ctypes.c_uint64()
        code = self._lib.tc_arena_retire(self._live_handle(), size_class, count, ctypes.byref(done))
        if code == _native.TC_ERELEASE:  # the slot stays in use, as it was: less memory goes back than asked
            logger.warning("%s: %d of %d slots of %s given back, then the kernel refused (%s)", self.name,
                           done.value, count, fmt_bytes(self._classes[size_class][0]), _native.strerror(code))
        elif code != _native.TC_OK:
            raise ValueError(f"{self.name}: cannot retire slots of class {size_class}: {_native.strerror(code)}")
        return int(done.value)

    def restore(self, size_class: int, count: int) -> int:
        """Put up to ``count`` retired slots of class index ``size_class`` back in use (locked again where the
        class is). Returns how many; fewer than asked when no more are retired or the memlock limit stops it."""
        if count <= 0:
            return 0
        done = ctypes.c_uint64()
        code = self._lib.tc_arena_restore(self._live_handle(), size_class, count, ctypes.byref(done))
        if code == _native.TC_ELOCK:
            logger.warning("%s: %d of %d slots of %s brought back, then mlock failed: %s", self.name, done.value,
                           count, fmt_bytes(self._classes[size_class][0]), _memlock_message(
                               self.name, self._classes[size_class][0], "could not page-lock", MEMLOCK_RAISE))
        elif code != _native.TC_OK:
            raise ValueError(f"{self.name}: cannot restore slots of class {size_class}: {_native.strerror(code)}")
        return int(done.value)

    def retired_slots(self, size_class: int) -> int:
        return int(self._class_stats(size_class).slots_retired)

    # -- introspection ----------------------------------------------------------------------------------

    @property
    def classes(self) -> List[Tuple[int, int]]:
        """(slot_bytes, slot_count) per class, ascending, after rounding and merging."""
        return list(self._classes)

    @property
    def closed(self) -> bool:
        return self._handle is None

    def regions(self) -> List[Tuple[int, int]]:
        """(base address, nbytes) of each region; region i holds the slots of class i. Fixed until close()."""
        regions = []
        for i in range(len(self._classes)):
            base, nbytes = ctypes.c_void_p(), ctypes.c_uint64()
            code = self._lib.tc_arena_region(self._live_handle(), i, ctypes.byref(base), ctypes.byref(nbytes))
            assert code == _native.TC_OK, _native.strerror(code)
            regions.append((base.value, nbytes.value))
        return regions

    def free_slots(self) -> int:
        """Slots that can be handed out now (neither in use nor retired), over all classes."""
        return sum(c.slot_count - c.slots_in_use - c.slots_retired
                   for c in map(self._class_stats, range(len(self._classes))))

    def stats(self) -> Dict[str, int]:
        """Counters as a flat dict (bytes are ``*_bytes``); per class ``class.<slot_bytes>.{slots,in_use,
        peak_in_use,retired}`` in slots. ``registered_bytes`` is what cudaHostRegister accepted; ``retired_bytes``
        the slots whose pages were given back (reserved addresses, no memory)."""
        s = self._native_stats()
        out = {
            "reserved_bytes": s.reserved, "locked_bytes": s.locked, "in_use_bytes": s.in_use,
            "peak_in_use_bytes": s.peak_in_use, "requested_in_use_bytes": s.requested_in_use,
            "allocs": s.allocs, "frees": s.frees, "failed_allocs": s.failed_allocs,
            "lock_fallbacks": s.lock_fallbacks, "retired_bytes": s.retired,
            "registered_bytes": sum(nbytes for _base, nbytes in self._registered),
        }
        for cls, (slot_bytes, _count) in enumerate(self._classes):
            c = self._class_stats(cls)
            out[f"class.{slot_bytes}.slots"] = c.slot_count
            out[f"class.{slot_bytes}.in_use"] = c.slots_in_use
            out[f"class.{slot_bytes}.peak_in_use"] = c.peak_slots_in_use
            out[f"class.{slot_bytes}.retired"] = c.slots_retired
        return out

    def validate(self) -> None:
        """Walk every native invariant. Raises AssertionError if one is broken (a bug, never a user error;
        build csrc/arena.c with -DTC_DEBUG to have the failed check printed)."""
        code = self._lib.tc_arena_validate(self._live_handle())
        if code != _native.TC_OK:
            raise AssertionError(f"{self.name}: tc_arena_validate failed: {_native.strerror(code)}")

    # -- lifetime ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Unregister from CUDA and unmap every region. Idempotent. Slots and their tensors become invalid."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        registered, self._registered = self._registered, []
        if registered:
            pinning.unregister_regions(registered)
        self._lib.tc_arena_destroy(handle)

    def __enter__(self) -> "PinnedArena":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may already be gone; the OS unmaps anyway
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._classes)} classes"
        return f"PinnedArena({self.name!r}, {state})"

    # -- helpers ----------------------------------------------------------------------------------------

    def _live_handle(self) -> int:
        handle = self._handle
        if handle is None:
            raise ValueError(f"{self.name}: the arena is closed")
        return handle

    def _native_stats(self) -> "_native.TcStats":
        out = _native.TcStats()
        code = self._lib.tc_arena_stats(self._live_handle(), ctypes.byref(out))
        assert code == _native.TC_OK, _native.strerror(code)
        return out

    def _class_stats(self, cls: int) -> "_native.TcClassStats":
        out = _native.TcClassStats()
        code = self._lib.tc_arena_class_stats(self._live_handle(), cls, ctypes.byref(out))
        assert code == _native.TC_OK, _native.strerror(code)
        return out


def _whole_pages(class_counts: Dict[int, int]) -> Dict[int, int]:
    """``class_counts`` with every slot size a whole number of pages (sizes equal after rounding merged). The
    native arena aligns slots to 4 KiB; where pages are larger, a slot would share a page with its neighbour, and
    retiring it (munlock and madvise round out to whole pages) would give back, and so zero, the neighbour's
    first bytes."""
    page = arena_page_bytes()
    if page <= 4096:
        return class_counts
    merged: Dict[int, int] = {}
    for slot_bytes, count in class_counts.items():
        size = round_up(slot_bytes, page)
        merged[size] = merged.get(size, 0) + count
    _check_class_counts(merged)  # (merged counts may pass the native limit)
    return merged


def _check_class_counts(class_counts) -> None:
    if not isinstance(class_counts, dict) or not class_counts:
        raise TencacheConfigError(f"class_counts must be a non-empty dict slot_bytes -> count, got {class_counts!r}")
    if len(class_counts) > 64:  # TC_MAX_CLASSES
        raise TencacheConfigError(f"class_counts has {len(class_counts)} classes; at most 64 are supported")
    for slot_bytes, count in class_counts.items():
        for what, value in (("slot_bytes", slot_bytes), ("count", count)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise TencacheConfigError(f"class_counts[{slot_bytes!r}]: {what} must be a positive int, "
                                          f"got {value!r}")
        if count > 2**32 - 1:
            raise TencacheConfigError(f"class_counts[{slot_bytes}]: at most {2**32 - 1} slots per class, "
                                      f"got {count}")


def _fmt_limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else f"{fmt_bytes(value)} ({value} bytes)"


def _memlock_message(name: str, nbytes: int, what: str, fix: str) -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    locked = locked_bytes_now()
    already = "" if locked is None else f"; this process already has {fmt_bytes(locked)} locked"
    if soft == resource.RLIM_INFINITY:  # then the limit is not why mlock failed: the host lacks free memory
        fix = "free host memory or lower \"tencache\": {\"host_cache_bytes\": ...}"
    return (f"{name}: {what} {fmt_bytes(nbytes)} ({nbytes} bytes) of host memory; the memlock limit "
            f"(RLIMIT_MEMLOCK, `ulimit -l`) is {_fmt_limit(soft)}, hard {_fmt_limit(hard)}{already}. "
            f"To fix: {fix}")
