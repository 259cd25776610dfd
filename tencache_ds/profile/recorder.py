"""Recording the live step. Owns: cutting a stream of accesses into steps (a StepProfile each: the order, each
access's size and time, the NVMe reads' durations, the waits for I/O) and checking each access against the
sequence the profile expects. Pure: no torch; callers pass sizes and the futures of their reads.

Threads: ``touch``, ``stalled``, ``expect`` and ``end_step`` are called under the caller's lock. A read timer runs
on the I/O thread that finished the read; it assigns one element of the list of the step it was issued in (atomic
under the GIL), so a read that completes after its step ended is simply not counted.
"""
import time
from concurrent.futures import Future
from typing import Callable, Hashable, List, Optional, Sequence

from .step_profile import StepProfile

# A step longer than this is not a training step we can learn from (inference or generation never ends one):
# stop recording rather than grow without bound. About 40 MB of lists; models have thousands of tensors.
MAX_STEP_ACCESSES = 1_000_000


class StepRecorder:
    """``touch(key, nbytes)`` for every access; ``end_step()`` returns the finished step (None if empty or too
    long) and starts the next. ``position`` is the index of the next access within the current step.

    Timings: ``read_timer(index)`` right before the read of access ``index`` is issued, its result passed to the
    read future's ``add_done_callback`` (issue to completion); ``stalled(seconds)`` whenever the caller waited
    for I/O (``clock`` is the clock to measure it with).

    Divergence: after ``expect(keys, on_diverge)``, each access is compared with ``keys[position]`` (one
    comparison); at the first that differs, or one past the end, ``on_track`` turns False and
    ``on_diverge(position)`` is called once. ``end_step`` puts it back on track (the expectation stays).

    Args:
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self._expected: Optional[Sequence[Hashable]] = None
        self._on_diverge: Optional[Callable[[int], None]] = None
        self._new_step(self.clock())

    def _new_step(self, started: float) -> None:
        self._started = started
        self._position = 0
        self._keys: List[Hashable] = []
        self._nbytes: List[int] = []
        self._offset_s: List[float] = []
        self._read_s: List[Optional[float]] = []
        self._stall_s: List[float] = [0.0]  # one per gap; the last is the gap the step is in now
        self.on_track = True
        self.diverged_at: Optional[int] = None

    @property
    def position(self) -> int:
        return self._position

    def expect(self, keys: Optional[Sequence[Hashable]],
               on_diverge: Optional[Callable[[int], None]] = None) -> None:
        """Check the coming accesses against ``keys`` (None: check nothing) from the current position on."""
        self._expected, self._on_diverge = keys, on_diverge

    def touch(self, key: Hashable, nbytes: int = 0) -> int:
        """Record one access; returns its index in the step."""
        index = self._position
        self._position += 1
        if self.on_track and self._expected is not None and \
                (index >= len(self._expected) or self._expected[index] != key):
            self.on_track, self.diverged_at = False, index
            if self._on_diverge is not None:
                self._on_diverge(index)
        if index < MAX_STEP_ACCESSES:
            self._keys.append(key)
            self._nbytes.append(int(nbytes))
            self._offset_s.append(self.clock() - self._started)
            self._read_s.append(None)
            self._stall_s.append(0.0)
        elif index == MAX_STEP_ACCESSES:  # too long to be a training step: free what we kept
            self._keys, self._nbytes, self._offset_s, self._read_s, self._stall_s = [], [], [], [], []
        return index

    def read_timer(self, index: int) -> Callable[[Future], None]:
        """Call just before issuing access ``index``'s read; pass the result to the read's add_done_callback."""
        issued, durations, clock = self.clock(), self._read_s, self.clock

        def finished(future: Future) -> None:
            if index < len(durations) and not future.cancelled() and future.exception() is None:
                durations[index] = clock() - issued
        return finished

    def read_took(self, index: int, seconds: float) -> None:
        """Access ``index``'s NVMe read took ``seconds`` (for reads issued before their access was recorded:
        prefetches, recorded when used)."""
        if index < len(self._read_s):
            self._read_s[index] = seconds

    def stalled(self, seconds: float) -> None:
        """The caller waited ``seconds`` for I/O (a read it needs, a write that frees a buffer)."""
        if self._stall_s:
            self._stall_s[-1] += seconds

    def end_step(self) -> Optional[StepProfile]:
        now = self.clock()
        complete = 0 < self._position <= MAX_STEP_ACCESSES
        step = StepProfile(tuple(self._keys), tuple(self._nbytes), tuple(self._offset_s), tuple(self._read_s),
                           tuple(self._stall_s), now - self._started) if complete else None
        self._new_step(now)
        return step
