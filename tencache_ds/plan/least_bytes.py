"""The fewest NVMe bytes one store can move per step through a host tier of a given size. Owns: a lower bound on a
store's reads and writes per step in steady state, from its profiled access sequence (profile/step_profile.py) and
what each access does to its tensor (reads the bytes there, changes them). Pure.

The model. A tensor's uses in one step, taken cyclically (steps repeat), cut its life into intervals, each from
one use to the next. Keeping the tensor in the tier over an interval saves what the interval's end would cost
otherwise: the read at the end, if that use reads the bytes, and the write of the bytes changed since the
interval's start (by the use there, or by the optimizer step for parameters: it runs between two recorded steps),
if the end reads them. E.g. an Adam moment used once per step: its one interval covers the whole step and saves a
read and a write; a gradient: written in backward, read in the update: the interval between saves a write and a
read, the one from the update to the next backward saves nothing (the bytes are dead). At every instant the kept
intervals hold at most the budget's bytes.

The most a tier can save is then a packing problem. A real tier keeps whole intervals; the bound lets it keep
fractions, which can only save more, so ``total - most_saved`` is a lower bound on the bytes moved:

- cut the cycle at a gap p: the intervals spanning p hold at most the budget there, so they save at most a
  budget's worth at their best rate per byte (a fractional knapsack);
- the other intervals lie on a line, where keeping the most bytes is solved exactly by taking intervals in the
  order they end, each as far as the room left along it allows (interval packing), times the best rate among them;
- the sum bounds what can be saved; the least sum over a few cuts (the step's boundary and the gaps that most
  bytes span) is taken.

Not plan/host_residency.py's steady_state: that replays the store's own policy (Belady with bypass by bytes),
which is a prediction, not a minimum: on gpt2-tiny with 6 sub-groups and a 68 MB optimizer budget it predicts
364 MB a step where the store moved 353 MB.
"""
import dataclasses
import re
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

from ..profile.step_profile import StepProfile

PARAMS, OPTIMIZER = "params", "optimizer"
GRADIENT_FILE = re.compile(r"^(?P<group>.+)_gradient_\d+_\d+\.tensor\.swp$")   # <ds_id>_gradient_<offset>_<numel>
STATE_FILE = re.compile(r"^(?:(?P<state>[^-]+)-)?(?P<group>[^-]+)\.tensor\.swp$")  # <ds_id>, <state>-<ds_id>
CUTS_TRIED = 8  # besides the step's boundary: the gaps the most bytes span


@dataclasses.dataclass(frozen=True)
class Use:
    """One access: ``reads`` (it needs the bytes there) and ``changes`` (it leaves new bytes). ``read_elsewhere``:
    the bytes it reads come from a copy another store holds (an fp32 master from the parameter partitions:
    integrations/deepspeed/master_copies.py), which holds the bytes it leaves too (its file is written only where
    something needs it: master_write_behind.py), so keeping the tensor saves neither a read nor a write."""

    reads: bool
    changes: bool
    read_elsewhere: bool = False


@dataclasses.dataclass(frozen=True)
class LeastBytes:
    """The least bytes per step a store moves through ``capacity_bytes``, and the bytes with nothing kept."""

    read_bytes: int
    write_bytes: int
    total_bytes: int            # reads and writes together (bounded on their own: may exceed the sum of the two)
    all_read_bytes: int         # nothing kept: every read
    all_write_bytes: int        # nothing kept: every write
    capacity_bytes: int

    def __add__(self, other: "LeastBytes") -> "LeastBytes":
        return LeastBytes(*(getattr(self, field.name) + getattr(other, field.name)
                            for field in dataclasses.fields(self)))


def store_uses(section: str, keys: Sequence[Hashable], masters_in_partitions: bool = False) -> List[Use]:
    """What each access of a store's step does. Parameters (``section`` "params"): every use reads, none changes (the
    optimizer step changes them all between steps). Optimizer state (swap file names, optimizer_swapper.py): the
    fp32 master and the moments (``<ds_id>.tensor.swp``, ``<state>-<ds_id>.tensor.swp``) are read and changed by the
    update, the master's read from the parameter partitions where ``masters_in_partitions``; a gradient
    (``<ds_id>_gradient_...``) is read by its update, the use right after its sub-group's state (else its last use in
    the step), and written without being read by every other use (backward)."""
    if section == PARAMS:
        return [Use(reads=True, changes=False) for _ in keys]
    uses: List[Optional[Use]] = [None] * len(keys)
    gradient_positions: Dict[Hashable, List[int]] = {}
    for position, key in enumerate(keys):
        if GRADIENT_FILE.match(str(key)):
            gradient_positions.setdefault(key, []).append(position)
        else:
            state_file = STATE_FILE.match(str(key))
            master = state_file is not None and state_file["state"] is None
            uses[position] = Use(reads=True, changes=True, read_elsewhere=masters_in_partitions and master)
    for key, positions in gradient_positions.items():
        group = GRADIENT_FILE.match(str(key))["group"]
        after_state = [position for position in positions if position > 0
                       and _state_group(keys[position - 1]) == group]
        update = after_state[-1] if after_state else positions[-1]
        for position in positions:
            uses[position] = Use(reads=True, changes=False) if position == update else Use(reads=False, changes=True)
    return uses


def _state_group(key: Hashable) -> Optional[str]:
    match = STATE_FILE.match(str(key))
    return match["group"] if match and not GRADIENT_FILE.match(str(key)) else None


@dataclasses.dataclass(frozen=True)
class _Interval:
    start_gap: int   # the first gap kept (the one after the use it starts at)
    length: int      # gaps covered, 1..n
    nbytes: int
    read_value: int  # bytes saved per byte kept: the read at the end
    write_value: int  # and the write of the bytes changed before it


def intervals(step: StepProfile, uses: Sequence[Use], changed_between_steps: bool) -> List[_Interval]:
    """Every tensor's intervals between consecutive uses, cyclically. Gap g is the stretch before use g; gap 0
    also holds the step's boundary (where the optimizer step changes parameters)."""
    n = len(step.keys)
    positions: Dict[Hashable, List[int]] = {}
    for position, key in enumerate(step.keys):
        positions.setdefault(key, []).append(position)
    sizes = step.tensor_nbytes()
    found = []
    for key, where in positions.items():
        for index, end in enumerate(where):
            start = where[index - 1]  # the previous use, cyclically (itself when used once)
            length = (end - start) % n or n
            crosses_boundary = start >= end
            changed = uses[start].changes or (changed_between_steps and crosses_boundary)
            reads = uses[end].reads
            here = not uses[end].read_elsewhere
            found.append(_Interval((start + 1) % n, length, sizes[key], int(reads and here),
                                   int(reads and changed and here)))
    return found


def least_bytes(step: StepProfile, section: str, capacity_bytes: int, masters_in_partitions: bool = False
                ) -> LeastBytes:
    """The lower bound for one store (``section``: "params" or "optimizer") whose tier keeps ``capacity_bytes``;
    ``masters_in_partitions``: the run filled fp32 masters from the parameter partitions (store_uses)."""
    found = intervals(step, store_uses(section, step.keys, masters_in_partitions),
                      changed_between_steps=section == PARAMS)
    n = len(step.keys)
    all_read = sum(interval.nbytes * interval.read_value for interval in found)
    all_write = sum(interval.nbytes * interval.write_value for interval in found)

    def least(value) -> int:
        total = sum(interval.nbytes * value(interval) for interval in found)
        useful = [interval for interval in found if value(interval)]
        return max(0, total - most_saved(useful, value, n, capacity_bytes))

    return LeastBytes(least(lambda i: i.read_value), least(lambda i: i.write_value),
                      least(lambda i: i.read_value + i.write_value), all_read, all_write, capacity_bytes)


def most_saved(found: Sequence[_Interval], value, n: int, capacity_bytes: int) -> float:
    """An upper bound on the bytes saved by keeping intervals (fractions allowed) within ``capacity_bytes`` at every
    gap: the least, over the cuts tried, of the spanning intervals' knapsack plus the line's packing."""
    if not found or capacity_bytes <= 0:
        return 0
    spanned = [0] * (n + 1)  # bytes spanning each gap (a difference array over the cycle)
    for interval in found:
        for start, end in _pieces(interval, n):
            spanned[start] += interval.nbytes
            spanned[end] -= interval.nbytes
    running, load = 0, []
    for gap in range(n):
        running += spanned[gap]
        load.append(running)
    if max(load) <= capacity_bytes:  # everything fits at every gap: everything is saved
        return sum(interval.nbytes * value(interval) for interval in found)
    cuts = [0] + sorted(range(n), key=lambda gap: -load[gap])[:CUTS_TRIED]
    return min(_saved_with_cut(found, value, n, capacity_bytes, cut) for cut in dict.fromkeys(cuts))


def _pieces(interval: _Interval, n: int) -> List[Tuple[int, int]]:
    """The gaps an interval covers as [start, end) ranges within 0..n."""
    end = interval.start_gap + interval.length
    if end <= n:
        return [(interval.start_gap, end)]
    return [(interval.start_gap, n), (0, end - n)]


def _covers(interval: _Interval, gap: int, n: int) -> bool:
    return (gap - interval.start_gap) % n < interval.length


def _saved_with_cut(found: Sequence[_Interval], value, n: int, capacity_bytes: int, cut: int) -> float:
    spanning = [interval for interval in found if _covers(interval, cut, n)]
    rest = [interval for interval in found if not _covers(interval, cut, n)]
    saved, room = 0, capacity_bytes
    for interval in sorted(spanning, key=value, reverse=True):  # the fractional knapsack: best rate first
        kept = min(room, interval.nbytes)
        saved += kept * value(interval)
        room -= kept
        if not room:
            break
    if rest:
        # On the line that starts just after the cut, each interval is [a, b): gaps cut+1+a .. cut+b.
        line = [((interval.start_gap - cut - 1) % n, (interval.start_gap - cut - 1) % n + interval.length,
                 interval.nbytes) for interval in rest]
        saved += max(value(interval) for interval in rest) * pack_line(line, n, capacity_bytes)
    return saved


def pack_line(line: Sequence[Tuple[int, int, int]], length: int, capacity_bytes: int) -> int:
    """The most bytes of intervals ``(start, end, nbytes)`` (gaps start..end-1 of 0..length-1) that can be kept with at
    most ``capacity_bytes`` at every gap, fractions allowed: by earliest end, each kept as far as the room left
    along it allows. E.g. (0, 2, 3), (1, 3, 3), (2, 4, 3) in 4 bytes: 3 + 1 + 3 = 7."""
    tree = _MaxAddTree(length)
    kept = 0
    for start, end, nbytes in sorted(line, key=lambda interval: interval[1]):
        take = min(nbytes, capacity_bytes - tree.max(start, end))
        if take > 0:
            tree.add(start, end, take)
            kept += take
    return kept


class _MaxAddTree:
    """A segment tree over ``size`` gaps: add to a range, the largest value in a range."""

    def __init__(self, size: int):
        self.size = max(1, size)
        self.top = [0] * (4 * self.size)
        self.pending = [0] * (4 * self.size)

    def add(self, start: int, end: int, amount: int) -> None:
        self._add(1, 0, self.size, start, end, amount)

    def max(self, start: int, end: int) -> int:
        return self._max(1, 0, self.size, start, end)

    def _add(self, node, low, high, start, end, amount):
        if end <= low or high <= start:
            return
        if start <= low and high <= end:
            self.top[node] += amount
            self.pending[node] += amount
            return
        middle = (low + high) // 2
        self._add(2 * node, low, middle, start, end, amount)
        self._add(2 * node + 1, middle, high, start, end, amount)
        self.top[node] = self.pending[node] + max(self.top[2 * node], self.top[2 * node + 1])

    def _max(self, node, low, high, start, end):
        if end <= low or high <= start:
            return 0
        if start <= low and high <= end:
            return self.top[node]
        middle = (low + high) // 2
        return self.pending[node] + max(self._max(2 * node, low, middle, start, end),
                                        self._max(2 * node + 1, middle, high, start, end))
