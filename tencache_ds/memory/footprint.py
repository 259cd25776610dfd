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
    ``close()`` stops the sampling thread (idempotent; also when the meter is garbage collected); a closed meter
    returns None."""

    def __init__(self, read_resident: Callable[[], int] = anonymous_resident_bytes,
                 interval_s: float = SAMPLE_INTERVAL_S):
        self._read = read_resident
        self._lock = threading.Lock()
        self._peak = 0             # LOCK: the highest sample since the last boundary
        self._at_boundary: Optional[int] = None
        self._stop = threading.Event()
        # The thread holds the meter weakly, so a meter nobody closes still ends with its owner.
        self._thread = threading.Thread(target=_sample, args=(weakref.ref(self), self._stop, interval_s),
                                        name="tencache-footprint", daemon=True)
        self._thread.start()

    def boundary(self) -> Optional[int]:
        if self._stop.is_set():
            return None
        now = self._read()
        with self._lock:
            peak, self._peak = max(self._peak, now), now
            previous, self._at_boundary = self._at_boundary, now
        if previous is None:
            return None
        return max(0, peak - max(previous, now))

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
        value = self._read()
        with self._lock:
            if value > self._peak:
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
