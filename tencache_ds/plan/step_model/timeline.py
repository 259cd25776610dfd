"""The step model's clock: the compute thread and the machine's channels (NVMe read, NVMe write, H2D), and the
rates they run at. Pure.

The compute thread runs the step's work in program order; an NVMe read, an NVMe write or an H2D copy occupies its
channel for ``bytes / bandwidth`` from when it is issued and the channel is free (reads and writes are separate
channels: a drive serves both at once; a read of a tensor waits for the pending write of the same tensor). The
thread waits when it needs bytes still moving; each wait is charged to its channel, so the step is
``compute + H2D wait + NVMe read wait + NVMe write wait + CPU Adam`` (the critical path, printed as such) and the
largest part is the bottleneck. Three steps are replayed and the last one is reported: writes left behind by one
step delay the next step's reads of the same tensors.
"""
import dataclasses
from collections import defaultdict
from typing import Dict, Optional

from ..machine import Machine

STEPS_REPLAYED = 3
# Stock's H2D copies come from mlock'ed, not CUDA-registered, memory: CUDA stages them through its own pinned
# buffer. NVIDIA's "How to Optimize Data Transfers in CUDA C/C++" measures pageable at about half of pinned.
PAGEABLE_H2D_FACTOR = 0.5


class Timeline:
    """The compute thread's clock and the channels it issues to; waits are charged to the channel waited on."""

    def __init__(self, rates: Dict[str, float]):
        self.rates = rates
        self.now = 0.0
        self.free = {channel: 0.0 for channel in rates}
        self.parts: Dict[str, float] = defaultdict(float)
        self.moved: Dict[str, int] = defaultdict(int)
        self.written_at: Dict[str, float] = {}

    def work(self, seconds: float, part: str) -> None:
        self.now += seconds
        self.parts[part] += seconds

    def issue(self, channel: str, nbytes: int, key: Optional[str] = None) -> float:
        """Queue ``nbytes`` on ``channel``; returns when they are done."""
        if nbytes <= 0:
            return self.now
        start = max(self.now, self.free[channel])
        if channel == "nvme_read" and key is not None:
            start = max(start, self.written_at.get(key, 0.0))
        done = start + nbytes / self.rates[channel]
        self.free[channel] = done
        self.moved[channel] += nbytes
        if channel == "nvme_write" and key is not None:
            self.written_at[key] = done
        return done

    def wait(self, done: float, channel: str) -> None:
        if done > self.now:
            self.parts[channel] += done - self.now
            self.now = done


@dataclasses.dataclass(frozen=True)
class Rates:
    flops_per_s: float
    adam_elements_per_s: float
    host_copy_bytes_per_s: float
    channels: Dict[str, float]


def channel_rates(machine: Machine, pinned_h2d: bool) -> Rates:
    h2d = machine.h2d_bytes_per_s * (1.0 if pinned_h2d else PAGEABLE_H2D_FACTOR)
    return Rates(machine.accelerator_flops_per_s, machine.cpu_adam_elements_per_s_per_rank,
                 machine.host_copy_bytes_per_s_per_rank,
                 {"nvme_read": machine.nvme_read_bytes_per_s_per_rank,
                  "nvme_write": machine.nvme_write_bytes_per_s_per_rank, "h2d": h2d})
