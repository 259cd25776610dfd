"""The step model's clock: the compute thread and the machine's channels (NVMe read, NVMe write, H2D), and the
rates they run at. Pure.

The compute thread runs the step's work in program order; an H2D copy occupies its channel for ``bytes / bandwidth``
from when it is issued and the channel is free. An NVMe request queues behind the earlier requests of its store
(parameters or optimizer state: each has its own engine) in its direction, and takes ``bytes / rate`` alone (a rate
at the size of the requests that move it: the machine's ``nvme_request_factors``; a read of a tensor waits for the
pending write of the same tensor). The queues share the drive: while several have work on it, the drive's time is
split evenly among them, and where reads and writes are both among them it moves what the machine's mixed rate says
(``mixed_share``: equal bytes read and written at once move at the mixed rate); a drive whose mixed rate has reads
and writes add up, or that has none, serves each direction as its own channel. Until 2026-11-30 (thirty-ninth
session) all of a direction's requests, or on a drive that does not add the two all requests, queued on one line: a
parameter read waited behind the optimizer reads issued before it, as no engine here makes it wait. The thread
waits when it needs bytes still moving; each wait is charged to its channel, so the step is ``compute + collectives
+ H2D wait + NVMe read wait + NVMe write wait + CPU Adam`` (the critical path, printed as such:
results.CRITICAL_PARTS) and the largest part is the bottleneck. Three steps are replayed and the last one is
reported: writes left behind by one step delay the next step's reads of the same tensors. The reported step is
never shorter than any channel's busy time in it, nor than the time the drive has a request in flight
(``steady_step``): three steps do not build a backlog of writes left behind up to its steady size.

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
# The engines that issue NVMe requests (``Timeline.issue``'s ``store``): each queues its own, in each direction.
PARAMS, OPTIMIZER = "params", "optimizer"
DRIVE = "nvme"  # Timeline.busy's entry for the span the drive has a request in flight, either direction
# Stock's H2D copies come from mlock'ed, not CUDA-registered, memory: CUDA stages them through its own pinned
# buffer. NVIDIA's "How to Optimize Data Transfers in CUDA C/C++" measures pageable at about half of pinned.
PAGEABLE_H2D_FACTOR = 0.5


class Timeline:
    """The compute thread's clock and the channels it issues to; waits are charged to the channel waited on."""

    def __init__(self, rates: Dict[str, float], mixed_share: Optional[float] = None,
                 nvme_request_factor: Callable[[str, int], float] = lambda direction, request_bytes: 1.0,
                 io_contention: float = 0.0):
        """``mixed_share``: None, reads and writes on separate channels; else (above 0, below 1) the share of its
        own rate each direction runs at while the other has work on the drive too (``mixed_share()``).
        ``nvme_request_factor(direction, request_bytes)``: the drive's rate at that request size over its rate
        figure (Machine.nvme_request_factor). ``io_contention``: the seconds work loses per second the drive is
        busy beside it (Machine.io_contention; 0: none)."""
        self.rates = rates
        self.mixed_share = mixed_share
        self.nvme_request_factor = nvme_request_factor
        self.io_contention = io_contention
        self.nvme_busy: List[Tuple[float, float]] = []  # (start, end) of each NVMe request not yet behind ``now``
        self.now = 0.0
        self.free: Dict[str, float] = defaultdict(float)  # when each queue's last request is done
        self.direction: Dict[str, str] = {}  # each NVMe queue's channel
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

    def issue(self, channel: str, nbytes: int, key: Optional[str] = None, request_bytes: Optional[int] = None,
              store: str = "") -> float:
        """Queue ``nbytes`` on ``channel``; returns when they are done. ``request_bytes``: the size of each request
        they are moved in (default: one request of ``nbytes``), which sets an NVMe channel's rate. ``store``: the
        engine that issues them (an NVMe channel's requests queue per store and direction; the queues share the
        drive, ``_on_shared_drive``)."""
        if nbytes <= 0:
            return self.now
        queue = f"{channel}/{store}" if store else channel
        start = max(self.now, self.free[queue])
        if channel == "nvme_read" and key is not None:
            start = max(start, self.written_at.get(key, 0.0))
        seconds = nbytes / self.rates[channel]
        if channel in NVME_DIRECTIONS:
            seconds /= self.nvme_request_factor(NVME_DIRECTIONS[channel], request_bytes or nbytes)
            drive_end = max((self.free[other] for other in self.direction), default=0.0)
            self.direction[queue] = channel
            done = self._on_shared_drive(queue, start, seconds)
            self.free[queue] = done
            self.busy[channel] += seconds
            self.busy[DRIVE] += max(self.free[other] for other in self.direction) - max(drive_end, start)
            if self.io_contention:
                self.nvme_busy.append((start, done))
        else:
            done = start + seconds
            self.free[queue] = done
            self.busy[channel] += seconds
        self.moved[channel] += nbytes
        if channel == "nvme_write" and key is not None:
            self.written_at[key] = done
        return done

    def _on_shared_drive(self, queue: str, start: float, seconds: float) -> float:
        """When a request of ``seconds`` alone, on ``queue`` from ``start``, is done on a drive that other queues
        still have work on. The drive's capacity (1: a request alone at its own rate) is split evenly among the
        queues with work; where reads and writes are both among them, the capacity is ``2 x mixed_share``, or
        without a mixed rate each direction is its own channel and the other's queues are left out. The queues
        already there run slower by as much and end later (their work left at their own pace, ``free - start``).
        Their requests already issued keep the ends they were given (the replay hands each one its end when
        issued); their queues, what is issued behind them, and the drive's busy time do not."""
        channel = self.direction[queue]
        pending = {other: self.free[other] - start for other in self.direction
                   if other != queue and self.free[other] > start
                   and (self.mixed_share is not None or self.direction[other] == channel)}
        if not pending:
            return start + seconds
        mixed_before = len({self.direction[other] for other in pending}) > 1
        mixed_now = mixed_before or any(self.direction[other] != channel for other in pending)
        capacity = 2.0 * self.mixed_share if mixed_now else 1.0
        share = capacity / (len(pending) + 1)
        pace = min(1.0, (capacity - share) / (2.0 * self.mixed_share if mixed_before else 1.0))
        longest = max(pending.values())
        if seconds <= share * longest / pace:
            done = start + seconds / share
        else:  # the others empty first: alone after them
            together = longest / pace
            done = start + together + seconds - share * together
        for other, left in pending.items():
            moved_meanwhile = pace * (done - start)
            self.free[other] = start + left / pace if left <= moved_meanwhile else done + left - moved_meanwhile
        return done

    def wait(self, done: float, channel: str) -> None:
        if done > self.now:
            self.parts[channel] += done - self.now
            self.now = done

    def steady_step(self, step_s: float, parts: Dict[str, float], busy_before: Dict[str, float]) -> float:
        """The step at steady state: at least each channel's busy time in it (its bytes at its rates), and the
        time the drive has a request in flight (``DRIVE``: longer than either direction's where they share it).
        Bytes a step leaves moving behind it (tencache's writes) are the next step's to wait for; the replayed
        steps do not build that backlog up to its steady size, so a step shorter than a channel's busy time would
        be one the channel cannot keep up with. The difference is added to that channel's entry of ``parts`` (the
        drive's: to the direction that was busier), so the critical path still adds up to the step."""
        busy = {channel: seconds - busy_before.get(channel, 0.0) for channel, seconds in self.busy.items()}
        channel = max(busy, key=busy.get, default=None)
        if channel is None or busy[channel] <= step_s:
            return step_s
        charged = max(NVME_DIRECTIONS, key=lambda direction: busy.get(direction, 0.0)) if channel == DRIVE else channel
        parts[charged] = parts.get(charged, 0.0) + busy[channel] - step_s
        return busy[channel]


@dataclasses.dataclass(frozen=True)
class Rates:
    flops_per_s: float
    adam_elements_per_s: float
    host_copy_bytes_per_s: float
    channels: Dict[str, float]
    mixed_share: Optional[float] = None
    module_call_s: float = 0.0  # ZeRO-3's hooks per submodule use (plan/machine.py, zero3_module_call_s)
    nvme_request_factor: Callable[[str, int], float] = lambda direction, request_bytes: 1.0
    io_contention: float = 0.0  # plan/machine.py, io_contention

    def timeline(self) -> "Timeline":
        return Timeline(self.channels, self.mixed_share, self.nvme_request_factor, self.io_contention)


def mixed_share(read: float, write: float, mixed: Optional[float]) -> Optional[float]:
    """The share of its own rate each direction keeps while the other is on the drive too, chosen so that equal
    bytes read and written at once (the calibration's mixed trial) move at the mixed rate: both at the share until
    the faster direction is done, the slower alone after it, in ``2 x bytes / mixed``. E.g. read 0.88, write 1.02,
    mixed 0.87 GB/s (this VM, run 15): 0.46, a little worse than taking them in turn (0.5). None (separate
    channels, each at its full rate) without a mixed rate, or with one at which the share would be 1 or more: such
    a drive serves both as if alone."""
    if mixed is None:
        return None
    fast, slow = max(read, write), min(read, write)
    behind = 2.0 / mixed - 1.0 / slow + 1.0 / fast  # seconds per byte the faster direction runs at its share
    share = 1.0 / (fast * behind) if behind > 0 else float("inf")
    return share if share < 1.0 else None


def channel_rates(machine: Machine, pinned_h2d: bool) -> Rates:
    h2d = machine.h2d_bytes_per_s * (1.0 if pinned_h2d else PAGEABLE_H2D_FACTOR)
    read, write = machine.nvme_read_bytes_per_s_per_rank, machine.nvme_write_bytes_per_s_per_rank
    return Rates(machine.accelerator_flops_per_s_per_rank, machine.cpu_adam_elements_per_s_per_rank,
                 machine.host_copy_bytes_per_s_per_rank, {"nvme_read": read, "nvme_write": write, "h2d": h2d},
                 mixed_share(read, write, machine.nvme_mixed_bytes_per_s_per_rank),
                 machine.zero3_module_call_s, machine.nvme_request_factor, machine.io_contention)
