"""The bound on tencache's step time. Owns: the NVMe path's measured rates (NvmeBandwidth), the least compute a step
needs (least_compute) and the Bound that combines them with the NVMe bytes per step. Does not own: measuring the
drive (io/drive_rate.py, run by cli/bench.py) or the per-step series (bench/report_runs.py). Pure."""
import dataclasses
from typing import Any, Dict, Optional, Tuple

from ..units import fmt_bytes
from .report_runs import Value, is_number


@dataclasses.dataclass(frozen=True)
class NvmeBandwidth:
    """Sequential bandwidth of the NVMe path in bytes per second: measured by the bench as `tencache-ds doctor`
    measures it, or given with --nvme-bandwidth (then read = write). ``source`` says which, for the report."""

    read_bytes_per_s: float
    write_bytes_per_s: float
    source: str

    def speeds(self) -> str:
        if self.read_bytes_per_s == self.write_bytes_per_s:
            return f"{self.read_bytes_per_s / 1e9:.2f} GB/s"
        return f"read {self.read_bytes_per_s / 1e9:.2f} GB/s, write {self.write_bytes_per_s / 1e9:.2f} GB/s"

    def describe(self) -> str:
        return f"{self.speeds()} ({self.source})"


@dataclasses.dataclass(frozen=True)
class Bound:
    """The I/O-compute bound on tencache's step time: the larger of ``compute_s``, the least time the step's work
    takes without waiting for NVMe (the smaller of stock CPU offload's step, the same work with no NVMe at all, and
    tencache's own step less the time it was blocked on NVMe; ``compute_source`` says which), and ``io_s``, the time the NVMe
    path needs for the bytes tencache moves per step (median read / read bandwidth + median written / write
    bandwidth: reads and writes share the drive; None without a bandwidth). A step cannot beat either part, so
    ``step time / bound`` near 1 means nothing is left to win on this machine."""

    compute_s: Optional[float]
    io_s: Optional[float]
    bandwidth: Optional[NvmeBandwidth]
    read_bytes: Optional[float] = None
    write_bytes: Optional[float] = None
    compute_source: str = "the stock-cpu step"

    @property
    def seconds(self) -> Optional[float]:
        # No NVMe bytes and no compute arm bound nothing: "0 s" would read as a bound the step cannot reach.
        parts = [part for part in (self.compute_s, self.io_s) if part is not None and part > 0]
        return max(parts) if parts else None

    @property
    def limited_by(self) -> Optional[str]:
        if self.seconds is None:
            return None
        return "NVMe" if self.io_s is not None and self.io_s >= (self.compute_s or 0.0) else "compute"

    def describe(self) -> str:
        """One line: the bound and its two parts, or why it is missing (bench.md names the bandwidth's source)."""
        parts = [f"compute {self.compute_s:.3f} s ({self.compute_source})" if self.compute_s is not None
                 else "compute: unknown (run with --compare cpu)"]
        if self.io_s is not None:
            parts.append(f"NVMe {self.io_s:.3f} s ({fmt_bytes(self.read_bytes or 0)} read + "
                         f"{fmt_bytes(self.write_bytes or 0)} written per step at {self.bandwidth.speeds()})")
        elif self.bandwidth is None:
            parts.append("NVMe: no bandwidth (not measured; pass --nvme-bandwidth)")
        else:
            parts.append("NVMe: tencache's bytes per step are unknown")
        if self.seconds is None:
            return "no bound: " + "; ".join(parts)
        return f"{self.seconds:.3f} s, limited by {self.limited_by}; " + "; ".join(parts)

    def to_dict(self) -> Dict[str, Any]:
        return {"seconds": self.seconds, "limited_by": self.limited_by, "compute_s": self.compute_s,
                "io_s": self.io_s, "read_bytes_per_step": self.read_bytes, "write_bytes_per_step": self.write_bytes,
                "bandwidth": dataclasses.asdict(self.bandwidth) if self.bandwidth else None,
                "text": self.describe()}


def compute_bound(read_bytes: Optional[float], write_bytes: Optional[float], bandwidth: Optional[NvmeBandwidth],
                  compute_s: Optional[float], compute_source: str = "the stock-cpu step") -> Bound:
    """The Bound for tencache moving ``read_bytes``/``write_bytes`` per step; e.g. 2 GB read + 1 GB written at
    2 GB/s each -> io_s 1.5 s, and with a 1.2 s stock CPU offload step the bound is 1.5 s (NVMe-limited)."""
    io_s = None
    if bandwidth is not None and is_number(read_bytes) and is_number(write_bytes):
        io_s = read_bytes / bandwidth.read_bytes_per_s + write_bytes / bandwidth.write_bytes_per_s
    return Bound(compute_s, io_s, bandwidth, read_bytes, write_bytes, compute_source)


def least_compute(stock_cpu_step: Value, tencache_step: Value, tencache_io_wait: Value
                  ) -> Tuple[Optional[float], str]:
    """The least time the step's work takes with no NVMe wait, and where it comes from: the smaller of stock CPU
    offload's step and tencache's step less its I/O wait (either can be the smaller: stock CPU offload has costs
    tencache avoids, such as gathering each parameter once per micro-batch), so that no step is measured below it."""
    candidates = []
    if is_number(stock_cpu_step):
        candidates.append((float(stock_cpu_step), "the stock-cpu step"))
    if is_number(tencache_step) and is_number(tencache_io_wait):
        candidates.append((float(tencache_step) - float(tencache_io_wait), "tencache's step less its NVMe wait"))
    return min(candidates) if candidates else (None, "")

