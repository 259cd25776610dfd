"""How busy this process keeps its drives. Owns: the time-weighted count of tencache's file requests being
executed (each I/O thread issues one system call at a time, so this is the queue depth the kernel sees from us):
the seconds with at least one request running, and the integral of the count over time. Per-step metrics
(metrics.py) turn their increase into a busy fraction and a mean queue depth while busy.

One tracker per process by default (``PROCESS_ACTIVITY``), shared by every DirectFileIO: the parameter and the
optimizer swappers have an engine each, and the drive is busy when either has a request running. Pure: the
standard library only.
"""
import threading
import time
from typing import Callable, Tuple


class IoActivity:
    """``started()`` when a request begins executing, ``finished()`` when it ends (also when it failed);
    ``totals()`` returns (busy seconds, depth-seconds) since the tracker was built.

    E.g. one request from t=0 to 2 and another from t=1 to 3: busy 3 s, depth-seconds 4, so a mean queue depth
    of 4 / 3 while busy.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._lock = threading.Lock()
        self._depth = 0          # requests executing now
        self._since = clock()    # when _depth last changed, or totals() last advanced
        self._busy_s = 0.0       # SUM: seconds with _depth > 0
        self._depth_s = 0.0      # SUM: integral of _depth over time

    def started(self) -> None:
        with self._lock:
            self._advance()
            self._depth += 1

    def finished(self) -> None:
        with self._lock:
            self._advance()
            self._depth -= 1

    def totals(self) -> Tuple[float, float]:
        with self._lock:
            self._advance()
            return self._busy_s, self._depth_s

    def _advance(self) -> None:
        now = self._clock()
        if self._depth > 0:
            elapsed = now - self._since
            self._busy_s += elapsed
            self._depth_s += self._depth * elapsed
        self._since = now


PROCESS_ACTIVITY = IoActivity()
