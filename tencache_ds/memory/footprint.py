"""How far this process's memory rises during a training step. Owns: sampling the anonymous resident set (what
only the process can give back: activations, gradients, temporaries; not page cache or mapped files, which the
kernel reclaims itself) between two boundaries (the host governor takes one before every forward pass and one
where each update starts), and reporting the rise above the level at the boundaries.
Does not own: what the rise means for the host tier (plan/memory_pressure.py).

Why sampling: the kernel keeps only the process's lifetime peak (VmHWM), and resetting it (/proc/self/clear_refs)
would change what every other tool reads (a benchmark's peak RSS, the user's own monitoring). A daemon thread
reads /proc/self/status every ``SAMPLE_INTERVAL_S`` (the file kept open: probes/host_memory.py; about 1% of a core
in all with the thread's wake-ups, measured in a two-rank training step on 2 cores) and keeps the highest value;
activations and gradients live for a large part of a step, far longer than one interval.
"""
import logging
import threading
import weakref
from typing import Callable, Optional

from ..probes.host_memory import anonymous_resident_bytes

logger = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 0.02


class StepRiseMeter:
    """``boundary()`` at each boundary returns how far resident memory rose above its level at the two boundaries
    around the stretch just ended (its own temporaries, not what it left allocated), or None for the first call.
    ``boundary(ends_span=True)`` also closes a span of stretches (the governor's: an optimizer step, from one
    step's first forward pass to the next one's) and returns the larger of the stretch's rise and the span's: its
    highest sample above its level at the span's two ends. A stretch alone misses memory that one stretch leaves
    allocated and the next frees: at 2 ranks gpt2-1.3b's backward rose 2.6 GiB above the step's start and kept 1.9
    GiB of it until the update had begun, so the backward's stretch measured 0.73 GiB, "auto" took back 2.4 GiB a
    rank on it, and the next step ended with the OOM killer (docs/reliability.md). A span alone misses a rise
    measured against a level the span ends higher at (an update that brings streaming slots back, a grown budget
    filled): why the stretches are there. Both are at most the rise above the step's start (after ``rebase``: above
    the level the give-back left, or above the step's end where that is higher).
    ``close()`` stops the sampling thread (idempotent; also when the meter is garbage collected); a closed meter
    returns None."""

    def __init__(self, read_resident: Callable[[], int] = anonymous_resident_bytes,
                 interval_s: float = SAMPLE_INTERVAL_S):
        self._read = read_resident
        self._lock = threading.Lock()
        self._peak = 0             # LOCK: the highest sample since the last boundary
        self._at_boundary: Optional[int] = None
        self._span_peak = 0        # LOCK: the highest sample since the span began, up to the last boundary
        self._span_start: Optional[int] = None  # LOCK: the level where the span began
        self._generation = 0       # LOCK: rebases so far: a sample read before one is dropped
        self._stop = threading.Event()
        # The thread holds the meter weakly, so a meter nobody closes still ends with its owner.
        self._thread = threading.Thread(target=_sample, args=(weakref.ref(self), self._stop, interval_s),
                                        name="tencache-footprint", daemon=True)
        self._thread.start()

    def boundary(self, ends_span: bool = False) -> Optional[int]:
        if self._stop.is_set():
            return None
        now = self._read()
        with self._lock:
            peak, self._peak = max(self._peak, now), now
            previous, self._at_boundary = self._at_boundary, now
            span_peak, span_start = max(self._span_peak, peak), self._span_start
            if ends_span or span_start is None:  # a new span begins here
                self._span_peak, self._span_start = now, now
            else:
                self._span_peak = span_peak
        if previous is None:
            return None
        rise = max(0, peak - max(previous, now))
        if ends_span and span_start is not None:
            rise = max(rise, span_peak - max(span_start, now))
        return rise

    def rebase(self) -> None:
        """Memory was given back right after a boundary (the host tier's shrink, at the same reading): the levels
        measured since the stretch and the span began are lowered by what the resident set fell, so that the next
        rise is measured against the level the step starts from, not the one before the give-back (which would hide
        up to the bytes given back)."""
        if self._stop.is_set():
            return
        now = self._read()
        with self._lock:
            self._generation += 1
            if self._at_boundary is None:
                return
            drop = max(0, self._at_boundary - now)
            self._at_boundary -= drop
            self._peak = max(now, self._peak - drop)
            if self._span_start is not None:
                self._span_start -= drop
                self._span_peak = max(self._span_start, self._span_peak - drop)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def __del__(self):
        self._stop.set()

    def _take_sample(self) -> None:
        with self._lock:
            generation = self._generation
        value = self._read()
        with self._lock:
            # read before a rebase: the level before the give-back, which would count as a rise that never was
            if value > self._peak and generation == self._generation:
                self._peak = value


def _sample(meter_ref, stop: threading.Event, interval_s: float) -> None:
    while not stop.wait(interval_s):
        meter = meter_ref()
        if meter is None:
            return
        try:
            meter._take_sample()
        except OSError as err:  # /proc unreadable (should not happen)
            logger.warning("tencache: cannot read this process's memory (%s): a step's rise is measured at step "
                           "boundaries only from now on, and may read lower than it is", err)
            return
        del meter
