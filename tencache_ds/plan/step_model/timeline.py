"""The step model's clock: the compute thread and the machine's channels (NVMe read, NVMe write, H2D), and the
rates they run at. Pure.

The compute thread runs the step's work in program order; an NVMe read, an NVMe write or an H2D copy occupies its
channel for ``bytes / bandwidth`` (an NVMe rate at the size of the requests that move them: the machine's
``nvme_request_factors``) from when it is issued and the channel is free (a read of a tensor waits for the
pending write of the same tensor). Reads and writes are separate channels, a drive serving both at once, unless the
machine's mixed rate is at most the harmonic mean of the two: then they queue on one shared drive, and a request that
follows one of the other direction still in the queue (reads and writes interleaved) takes ``shared_drive_scale``
times longer, so that an even mix moves the mixed rate. The
thread waits when it needs bytes still moving; each wait is charged to its channel, so the step is
``compute + collectives + H2D wait + NVMe read wait + NVMe write wait + CPU Adam`` (the critical path, printed as
such: results.CRITICAL_PARTS) and the
largest part is the bottleneck. Three steps are replayed and the last one is reported: writes left behind by one
step delay the next step's reads of the same tensors. The reported step is never shorter than any channel's busy
time in it (``steady_step``): three steps do not build a backlog of writes left behind up to its steady size.

Where the drive's requests cost the cores the step computes on (a host accelerator: the machine's
``io_contention``), work that runs while the drive is busy takes longer: ``io_contention`` times the seconds of it
in which a request is in flight (either direction, a read and a write at once counted once), charged to the same
part (its compute, CPU Adam or collective). On this VM a forward and backward ran 1.5-2x as long with the drive
reading beside it, and the drive read at 0.5-0.7 of its rate alone: the two took turns. The drive's own slowdown is
not modelled (its requests end when its rates say): where a step waits on the drive, the work beside it still ends
before the bytes do, and the prediction is short of the turn-taking.
"""
import dataclasses
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Tuple

from ..machine import Machine

STEPS_REPLAYED = 3
NVME_DIRECTIONS = {"nvme_read": "read", "nvme_write": "write"}
SHARED_DRIVE = "nvme"  # the queue reads and writes share when the drive does not serve both at once
# Stock's H2D copies come from mlock'ed, not CUDA-registered, memory: CUDA stages them through its own pinned
# buffer. NVIDIA's "How to Optimize Data Transfers in CUDA C/C++" measures pageable at about half of pinned.
PAGEABLE_H2D_FACTOR = 0.5


class Timeline:
    """The compute thread's clock and the channels it issues to; waits are charged to the channel waited on."""

    def __init__(self, rates: Dict[str, float], shared_drive_scale: Optional[float] = None,
                 nvme_request_factor: Callable[[str, int], float] = lambda direction, request_bytes: 1.0,
                 io_contention: float = 0.0):
        """``shared_drive_scale``: None, reads and writes on separate channels; else (1 or more) the factor on the
        time of a request that follows one of the other direction on the shared drive (``shared_drive_scale()``).
        ``nvme_request_factor(direction, request_bytes)``: the drive's rate at that request size over its rate
        figure (Machine.nvme_request_factor). ``io_contention``: the seconds work loses per second the drive is
        busy beside it (Machine.io_contention; 0: none)."""
        self.rates = rates
        self.shared_drive_scale = shared_drive_scale
        self.nvme_request_factor = nvme_request_factor
        self.io_contention = io_contention
        self.nvme_busy: List[Tuple[float, float]] = []  # (start, end) of each NVMe request not yet behind ``now``
        self.now = 0.0
        self.free = {channel: 0.0 for channel in rates}
        self.free[SHARED_DRIVE] = 0.0
        self.last_on_drive: Optional[str] = None  # the direction of the last request queued on the shared drive
        self.parts: Dict[str, float] = defaultdict(float)
        self.moved: Dict[str, int] = defaultdict(int)
        self.busy: Dict[str, float] = defaultdict(float)  # seconds each channel spent moving bytes
        self.written_at: Dict[str, float] = {}

    def work(self, seconds: float, part: str) -> None:
        if self.io_contention and seconds > 0:
            seconds += self.io_contention * self._nvme_busy_within(self.now, self.now + seconds)
        self.now += seconds
        self.parts[part] += seconds

    def _nvme_busy_within(self, start: float, end: float) -> float:
        """Seconds between ``start`` and ``end`` in which the drive has a request in flight, either direction (a
        read and a write at once count once: the probe times the drive busy, not each request), forgetting the
        requests that ended before ``start`` (``now`` never goes back)."""
        self.nvme_busy = [(first, last) for first, last in self.nvme_busy if last > start]
        busy, covered_to = 0.0, start
        for first, last in sorted((max(start, first), min(end, last)) for first, last in self.nvme_busy):
            if last > covered_to:
                busy += last - max(first, covered_to)
                covered_to = last
        return busy

    def issue(self, channel: str, nbytes: int, key: Optional[str] = None, request_bytes: Optional[int] = None) -> float:
        """Queue ``nbytes`` on ``channel``; returns when they are done. ``request_bytes``: the size of each request
        they are moved in (default: one request of ``nbytes``), which sets an NVMe channel's rate."""
        if nbytes <= 0:
            return self.now
        shared = self.shared_drive_scale is not None and channel in ("nvme_read", "nvme_write")
        queue = SHARED_DRIVE if shared else channel
        start = max(self.now, self.free[queue])
        if channel == "nvme_read" and key is not None:
            start = max(start, self.written_at.get(key, 0.0))
        seconds = nbytes / self.rates[channel]
        if channel in NVME_DIRECTIONS:
            seconds /= self.nvme_request_factor(NVME_DIRECTIONS[channel], request_bytes or nbytes)
        if shared:
            # Interleaved with the other direction (the request before it is of that direction and still queued):
            # the drive's mixed rate. A run of one direction, or a request to an idle drive, goes at its own rate.
            if self.last_on_drive not in (None, channel) and self.free[SHARED_DRIVE] > self.now:
                seconds *= self.shared_drive_scale
            self.last_on_drive = channel
        done = start + seconds
        if channel in NVME_DIRECTIONS and self.io_contention:
            self.nvme_busy.append((start, done))
        self.free[queue] = done
        self.moved[channel] += nbytes
        self.busy[channel] += seconds
        if channel == "nvme_write" and key is not None:
            self.written_at[key] = done
        return done

    def wait(self, done: float, channel: str) -> None:
        if done > self.now:
            self.parts[channel] += done - self.now
            self.now = done

    def steady_step(self, step_s: float, parts: Dict[str, float], busy_before: Dict[str, float]) -> float:
        """The step at steady state: at least each channel's busy time in it (its bytes at its rates; both NVMe
        directions together on a shared drive). Bytes a step leaves moving behind it (tencache's writes) are
        the next step's to wait for; the replayed steps do not build that backlog up to its steady size, so a
        step shorter than a channel's busy time would be one the channel cannot keep up with. The difference is
        added to that channel's entry of ``parts`` (on a shared drive, to the direction that was busier), so the
        critical path still adds up to the step."""
        busy = {channel: seconds - busy_before.get(channel, 0.0) for channel, seconds in self.busy.items()}
        queues = dict(busy)
        if self.shared_drive_scale is not None:
            directions = [channel for channel in NVME_DIRECTIONS if channel in busy]
            if directions:
                queues[max(directions, key=busy.get)] = sum(busy[channel] for channel in directions)
        channel = max(queues, key=queues.get, default=None)
        if channel is None or queues[channel] <= step_s:
            return step_s
        parts[channel] = parts.get(channel, 0.0) + queues[channel] - step_s
        return queues[channel]


@dataclasses.dataclass(frozen=True)
class Rates:
    flops_per_s: float
    adam_elements_per_s: float
    host_copy_bytes_per_s: float
    channels: Dict[str, float]
    shared_drive_scale: Optional[float] = None
    module_call_s: float = 0.0  # ZeRO-3's hooks per submodule use (plan/machine.py, zero3_module_call_s)
    nvme_request_factor: Callable[[str, int], float] = lambda direction, request_bytes: 1.0
    io_contention: float = 0.0  # plan/machine.py, io_contention

    def timeline(self) -> "Timeline":
        return Timeline(self.channels, self.shared_drive_scale, self.nvme_request_factor, self.io_contention)


def shared_drive_scale(read: float, write: float, mixed: Optional[float]) -> Optional[float]:
    """The factor on an interleaved request's time on a shared drive, chosen so that equal bytes read and written
    in turn take ``2 x bytes / mixed``: the harmonic mean of the two rates over the mixed rate. E.g. read 1.25,
    write 1.38, mixed 1.02 GB/s (this VM): 1.31 / 1.02 = 1.29; at the harmonic mean, 1: one queue, in turn. None
    (separate channels) without a mixed rate, or with one above the harmonic mean: such a drive overlaps the two
    directions better than taking them in turn, and one queue would predict it slower than it is (separate
    channels, each at its full rate, can predict it faster, up to read + write)."""
    if mixed is None:
        return None
    harmonic = 2.0 / (1.0 / read + 1.0 / write)
    return harmonic / mixed if mixed <= harmonic else None


def channel_rates(machine: Machine, pinned_h2d: bool) -> Rates:
    h2d = machine.h2d_bytes_per_s * (1.0 if pinned_h2d else PAGEABLE_H2D_FACTOR)
    read, write = machine.nvme_read_bytes_per_s_per_rank, machine.nvme_write_bytes_per_s_per_rank
    return Rates(machine.accelerator_flops_per_s_per_rank, machine.cpu_adam_elements_per_s_per_rank,
                 machine.host_copy_bytes_per_s_per_rank, {"nvme_read": read, "nvme_write": write, "h2d": h2d},
                 shared_drive_scale(read, write, machine.nvme_mixed_bytes_per_s_per_rank),
                 machine.zero3_module_call_s, machine.nvme_request_factor, machine.io_contention)
