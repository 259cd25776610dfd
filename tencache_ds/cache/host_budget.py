"""A host-memory budget that a cache reserves from entry by entry. Owns: the arithmetic only. How one host tier's
bytes are split between parameter partitions and optimizer state is plan/host_tier.py's."""
import threading


class HostBudget:
    """``try_reserve(n)`` takes n bytes if that many are left; ``release(n)`` gives them back. Invariant: 0 <= used;
    used <= total except after a ``resize`` below it, until enough is released."""

    def __init__(self, total_bytes: int):
        self.total_bytes = max(0, int(total_bytes))
        self._used = 0
        self._peak = 0
        self._lock = threading.Lock()

    def try_reserve(self, nbytes: int) -> bool:
        with self._lock:
            if self._used + nbytes > self.total_bytes:
                return False
            self._used += nbytes
            self._peak = max(self._peak, self._used)
            return True

    def resize(self, total_bytes: int) -> None:
        """A new total (memory pressure, or memory back). What is reserved stays reserved until released: a total
        below it lets nothing new in until enough is released."""
        with self._lock:
            self.total_bytes = max(0, int(total_bytes))

    def release(self, nbytes: int) -> None:
        with self._lock:
            if nbytes > self._used:  # a release twice: the budget would admit more than its total (not an assert:
                # python -O strips those)
                raise RuntimeError(f"host budget: {nbytes} bytes released, but only {self._used} are reserved")
            self._used -= nbytes

    def available(self) -> int:
        with self._lock:
            return max(0, self.total_bytes - self._used)

    def headroom(self) -> int:
        """The total less what is reserved: negative where a new total (memory pressure) fell below it."""
        with self._lock:
            return self.total_bytes - self._used

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def peak_bytes(self) -> int:
        return self._peak
