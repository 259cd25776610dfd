"""One training step as a profile records it. Owns: the data contract between the recorder (writes it), the
lifecycle and the profile file (keep it), and the planners and `tencache-ds profile show` (read it): the access
sequence with each access's size and time, and the compute time that implies. Pure.

An access is one request for a tensor (a lend from a store). Times are seconds since the step started (the end of
the previous step). Gap ``g`` is the stretch of the step that ends at access ``g``; gap ``n`` runs from the last
access to the end of the step::

    start                                                                              end
    |-- gap 0 --| a0 |-- gap 1: stall (a0's read) + compute --| a1 |-- gap 2 --| a2 |-- gap 3 --|
                ^ offset_s[0]                                 ^ offset_s[1]

``read_s[i]``: the NVMe read access ``i`` caused, from issue to completion (None: served from memory, or not
measured). ``stall_s[g]``: how long the program waited for I/O in gap ``g`` (its own read, an eviction's write);
the rest of the gap is compute. E.g. offsets [0.1, 0.5], stall_s [0, 0.3, 0.05], step_s 0.75: compute before a0
is 0.1, between a0 and a1 0.4 - 0.3 = 0.1, after a1 0.25 - 0.05 = 0.2.
"""
import dataclasses
import math
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

_ROUND_DIGITS = 7  # 0.1 microsecond: finer than any clock step we measure, and keeps the file small


@dataclasses.dataclass(frozen=True)
class StepProfile:
    """The accesses of one step, columns of equal length ``n`` (``stall_s``: ``n + 1``, one per gap)."""

    keys: Tuple[Hashable, ...]
    nbytes: Tuple[int, ...]
    offset_s: Tuple[float, ...]
    read_s: Tuple[Optional[float], ...]
    stall_s: Tuple[float, ...]
    step_s: float

    def __post_init__(self):
        n = len(self.keys)
        if not len(self.nbytes) == len(self.offset_s) == len(self.read_s) == n or len(self.stall_s) != n + 1:
            raise ValueError(f"a step profile needs {n} sizes, offsets and read times and {n + 1} stalls; got "
                             f"{len(self.nbytes)}, {len(self.offset_s)}, {len(self.read_s)}, {len(self.stall_s)}")

    @classmethod
    def untimed(cls, keys: Sequence[Hashable], nbytes: Optional[Sequence[int]] = None) -> "StepProfile":
        """An order without times (every gap 0): what a profile is when only the sequence is known."""
        n = len(keys)
        return cls(tuple(keys), tuple(nbytes) if nbytes is not None else (0,) * n, (0.0,) * n, (None,) * n,
                   (0.0,) * (n + 1), 0.0)

    def __len__(self) -> int:
        return len(self.keys)

    # ------------------------------------------------------------------------------------------ derived facts
    def gap_compute_s(self) -> List[float]:
        """Compute time of each gap (``n + 1`` of them): its length less its stall, never negative."""
        edges = (0.0,) + self.offset_s + (self.step_s,)
        return [max(0.0, edges[g + 1] - edges[g] - self.stall_s[g]) for g in range(len(self.keys) + 1)]

    @property
    def compute_s(self) -> float:
        return sum(self.gap_compute_s())

    @property
    def total_stall_s(self) -> float:
        return sum(self.stall_s)

    @property
    def accessed_bytes(self) -> int:
        return sum(self.nbytes)

    @property
    def read_bytes(self) -> int:
        """Bytes of the accesses that read NVMe with a measured time."""
        return sum(size for size, seconds in zip(self.nbytes, self.read_s) if seconds is not None)

    @property
    def measured_reads(self) -> int:
        """The accesses that read NVMe with a measured time (``read_bytes`` is their bytes)."""
        return sum(seconds is not None for seconds in self.read_s)

    @property
    def measured_read_s(self) -> float:
        return sum(seconds for seconds in self.read_s if seconds is not None)

    @property
    def measured_read_bytes_per_s(self) -> Optional[float]:
        """Read bandwidth seen by this step's reads (bytes over summed durations); None without measured reads, or
        where they read no byte (a profile file's zero sizes: its planning divided by it, helper-180)."""
        seconds, nbytes = self.measured_read_s, self.read_bytes
        return nbytes / seconds if seconds > 0 and nbytes > 0 else None

    def tensor_nbytes(self) -> Dict[Hashable, int]:
        """Each distinct key's size (its largest access)."""
        sizes: Dict[Hashable, int] = {}
        for key, size in zip(self.keys, self.nbytes):
            sizes[key] = max(size, sizes.get(key, 0))
        return sizes

    def same_sequence(self, other: Optional["StepProfile"]) -> bool:
        return other is not None and self.keys == other.keys

    def with_keys(self, convert: Callable[[Hashable], Hashable]) -> "StepProfile":
        """The same step with every key converted (store keys <-> the keys written to the file)."""
        return dataclasses.replace(self, keys=tuple(convert(key) for key in self.keys))

    # ------------------------------------------------------------------------------------------------- JSON
    def to_json(self) -> dict:
        def seconds(values):
            return [None if value is None else round(value, _ROUND_DIGITS) for value in values]
        return {"keys": list(self.keys), "nbytes": list(self.nbytes), "offset_s": seconds(self.offset_s),
                "read_s": seconds(self.read_s), "stall_s": seconds(self.stall_s),
                "step_s": round(self.step_s, _ROUND_DIGITS)}

    @classmethod
    def from_json(cls, data: dict) -> "StepProfile":
        """Raises ValueError (or TypeError/KeyError) for anything that is not a well-formed step profile: sizes
        are whole bytes, times finite seconds, none negative (they plan reads and price steps)."""
        keys = tuple(_hashable(key) for key in data["keys"])
        try:
            nbytes = tuple(int(size) for size in data["nbytes"])
        except OverflowError:  # JSON reads 1e400 (and Infinity) as an infinite float
            raise ValueError("an access size that is not finite") from None
        if any(size < 0 for size in nbytes):
            raise ValueError("negative access size")
        return cls(keys, nbytes, tuple(_seconds(value) for value in data["offset_s"]),
                   tuple(None if value is None else _seconds(value) for value in data["read_s"]),
                   tuple(_seconds(value) for value in data["stall_s"]), _seconds(data["step_s"]))


def _seconds(value) -> float:
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a time of {value!r} s (times are finite and not negative)")
    return seconds


def _hashable(key):
    if isinstance(key, list):  # JSON has no tuples: a tuple key comes back as a list
        return tuple(_hashable(part) for part in key)
    if isinstance(key, dict):
        raise ValueError(f"a profile key cannot be an object: {key!r}")
    return key
