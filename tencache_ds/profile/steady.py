"""The timings of the steps that repeated a profile. Owns: their summary (medians over the first few repeats) and
its JSON form. Pure.

A profile is the first training step (profile/lifecycle.py), and that step carries costs the steps after it do not:
the host tier's first fill, the allocator's first requests, DeepSpeed's first traced step. On this machine a
gpt2-small step (fp32, 2 x 64 tokens, a budget that holds everything) took 3.05 s as the profile and 1.65-1.75 s in
the five steps after it. The order of accesses the profile holds is what eviction and prefetch need. A planner that
prices a step as the run goes on (`tencache-ds estimate --profile`, plan/profile_timings.py) reads this summary.
"""
import dataclasses
import math
import statistics
from typing import Optional, Sequence

from .step_profile import StepProfile

STEADY_STEPS = 5  # repeats summarised: a median over five ignores one slow step; the file is rewritten each time


@dataclasses.dataclass(frozen=True)
class SteadyTimings:
    """``steps`` repeats of one profile: the median step, compute (step less its stalls) and stall times; their
    NVMe reads pooled (``read_bytes`` over ``read_s`` is the profile's own read rate, per request)."""

    steps: int
    step_s: float
    compute_s: float
    stall_s: float
    read_bytes: int
    read_s: float
    reads: int

    @classmethod
    def of(cls, repeats: Sequence[StepProfile]) -> "SteadyTimings":
        if not repeats:
            raise ValueError("steady timings need at least one step")
        return cls(steps=len(repeats), step_s=statistics.median(step.step_s for step in repeats),
                   compute_s=statistics.median(step.compute_s for step in repeats),
                   stall_s=statistics.median(step.total_stall_s for step in repeats),
                   read_bytes=sum(step.read_bytes for step in repeats),
                   read_s=sum(step.measured_read_s for step in repeats),
                   reads=sum(step.measured_reads for step in repeats))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Optional[dict]) -> Optional["SteadyTimings"]:
        """None for a section without the summary (saved before any step repeated it, or by an older tencache);
        raises ValueError for a malformed one."""
        if data is None:
            return None
        try:
            steady = cls(steps=int(data["steps"]), step_s=float(data["step_s"]), compute_s=float(data["compute_s"]),
                         stall_s=float(data["stall_s"]), read_bytes=int(data["read_bytes"]),
                         read_s=float(data["read_s"]), reads=int(data["reads"]))
        except (KeyError, TypeError, OverflowError) as err:  # (OverflowError: a count of 1e400 in the file)
            raise ValueError(f"malformed steady timings ({type(err).__name__}: {err})") from None
        seconds = (steady.step_s, steady.compute_s, steady.stall_s, steady.read_s)
        if steady.steps < 1 or not all(math.isfinite(value) and value >= 0 for value in seconds) \
                or steady.read_bytes < 0 or steady.reads < 0:
            raise ValueError(f"steady timings out of range: {data}")
        return steady
