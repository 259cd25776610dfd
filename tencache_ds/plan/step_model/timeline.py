"""The step model's clock: the compute thread and the machine's channels (NVMe read, NVMe write, H2D), and the
rates they run at. Pure.

The compute thread runs the step's work in program order; an H2D copy occupies its channel for ``bytes / bandwidth``
from when it is issued and the channel is free. An NVMe request goes to the drive (drive.py), queued behind the
earlier requests of its store (parameters or optimizer state) in its direction, with ``bytes / rate`` seconds of
work alone (a rate at the size of the requests that move it: the machine's ``nvme_request_factors``; a read of a
tensor waits for the pending write of the same tensor); the queues' heads share the drive, and where reads and
writes are both moving each direction gets the share the machine's mixed rate implies (``mixed_share``). Until
2026-11-30 (thirty-ninth session) all of a direction's requests, or on a drive that does not add the two all
requests, queued on one line and each was given its end when issued: a parameter read waited behind the optimizer
reads issued before it, as no engine here makes it wait. The thread waits when it needs bytes still moving; each
wait is charged to its channel, so the step is ``compute + collectives + H2D wait + NVMe read wait + NVMe write
wait + CPU Adam`` (the critical path, printed as such: results.CRITICAL_PARTS) and the largest part is the
bottleneck. Three steps are replayed and the last one is reported: writes left behind by one step delay the next
step's reads of the same tensors. The reported step is never shorter than any channel's busy time in it, nor than
the drive's least time for its reads and writes (``steady_step``): three steps do not build a backlog of writes left
behind up to its steady size.

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
from typing import Callable, Dict, Optional, Sequence, Union

from ..machine import Machine
from .drive import Drive, Request, drive_floor

STEPS_REPLAYED = 3
NVME_DIRECTIONS = {"nvme_read": "read", "nvme_write": "write"}
# The stores that issue NVMe requests (``Timeline.issue``'s ``store``), each queued on its own per direction:
# DeepSpeed's swappers have an aio handle per direction; tencache's store has one engine whose threads (2 by default)
# take requests in turn, so a read and a write can be in flight at once, which a queue per direction approximates.
PARAMS, OPTIMIZER = "params", "optimizer"
# Stock's H2D copies come from mlock'ed, not CUDA-registered, memory: CUDA stages them through its own pinned
# buffer. NVIDIA's "How to Optimize Data Transfers in CUDA C/C++" measures pageable at about half of pinned.
PAGEABLE_H2D_FACTOR = 0.5
Pending = Union[float, Request]  # what Timeline.issue returns: an H2D copy's end, or an NVMe request


class Timeline:
    """The compute thread's clock and the channels it issues to; waits are charged to the channel waited on."""

    def __init__(self, rates: Dict[str, float], mixed_share: Optional[float] = None,
                 nvme_request_factor: Callable[[str, int], float] = lambda direction, request_bytes: 1.0,
                 io_contention: float = 0.0):
        """``mixed_share``: None, reads and writes on separate channels; else (above 0, below 1) the share of the
        drive each direction gets while the other has a request moving too (``mixed_share()``).
        ``nvme_request_factor(direction, request_bytes)``: the drive's rate at that request size over its rate
        figure (Machine.nvme_request_factor). ``io_contention``: the seconds work loses per second the drive is
        busy beside it (Machine.io_contention; 0: none)."""
        self.rates = rates
        self.nvme_request_factor = nvme_request_factor
        self.io_contention = io_contention
        self.drive = Drive(mixed_share)
        self.now = 0.0
        self.free: Dict[str, float] = defaultdict(float)  # when each channel off the drive (H2D) is free
        self.parts: Dict[str, float] = defaultdict(float)
        self.moved: Dict[str, int] = defaultdict(int)
        self.busy: Dict[str, float] = defaultdict(float)  # seconds each channel's bytes take at its rates
        self.last_write: Dict[str, Request] = {}  # each tensor's latest write: a read of it waits for it

    def work(self, seconds: float, part: str) -> None:
        if self.io_contention and seconds > 0:
            # the drive is advanced exactly: nothing is issued while the thread works
            self.drive.advance(self.now)
            seconds += self.io_contention * self.drive.advance(self.now + seconds)
        self.now += seconds
        self.parts[part] += seconds

    def issue(self, channel: str, nbytes: int, key: Optional[str] = None, request_bytes: Optional[int] = None,
              store: str = "") -> Pending:
        """Queue ``nbytes`` on ``channel``; returns what ``wait`` waits for: an H2D copy's end, or the NVMe
        request (drive.py: its end depends on what is issued beside it later). ``request_bytes``: the size of
        each request they are moved in (default: one request of ``nbytes``), which sets an NVMe channel's rate.
        ``store``: the engine that issues an NVMe request (PARAMS, OPTIMIZER): each queues its own."""
        if nbytes <= 0:
            return self.now
        seconds = nbytes / self.rates[channel]
        self.moved[channel] += nbytes
        if channel not in NVME_DIRECTIONS:
            done = max(self.now, self.free[channel]) + seconds
            self.free[channel] = done
            self.busy[channel] += seconds
            return done
        seconds /= self.nvme_request_factor(NVME_DIRECTIONS[channel], request_bytes or nbytes)
        self.busy[channel] += seconds
        after = self.last_write.get(key) if channel == "nvme_read" and key is not None else None
        request = self.drive.add(Request(f"{channel}/{store}", channel, seconds, after), self.now)
        if channel == "nvme_write" and key is not None:
            self.last_write[key] = request
        return request

    def wait(self, pending: Union[Pending, Sequence[Pending]], channel: str) -> None:
        """The thread waits until ``pending`` (one of ``issue``'s results, or a list of them) is done."""
        for each in (pending if isinstance(pending, (list, tuple)) else [pending]):
            done = self.drive.finish(each) if isinstance(each, Request) else each
            if done > self.now:
                self.parts[channel] += done - self.now
                self.now = done

    def steady_step(self, step_s: float, parts: Dict[str, float], busy_before: Dict[str, float]) -> float:
        """The step at steady state: at least each channel's busy time in it (its bytes at its rates), and the
        drive's least time for its reads and writes (drive.drive_floor: more than either direction's where they
        share the drive). Bytes a step leaves moving behind it (tencache's writes) are the next step's to wait
        for; the replayed steps do not build that backlog up to its steady size, so a step shorter than a channel's
        busy time would be one the channel cannot keep up with. The difference is added to that channel's entry of
        ``parts`` (the drive's: to the direction with more work), so the critical path still adds up to the step."""
        busy = {channel: seconds - busy_before.get(channel, 0.0) for channel, seconds in self.busy.items()}
        floors = {channel: seconds for channel, seconds in busy.items() if channel not in NVME_DIRECTIONS}
        if any(channel in busy for channel in NVME_DIRECTIONS):
            # the drive's floor, charged to the direction with more work
            floors[max(NVME_DIRECTIONS, key=lambda direction: busy.get(direction, 0.0))] = drive_floor(
                busy.get("nvme_read", 0.0), busy.get("nvme_write", 0.0), self.drive.mixed_share)
        channel = max(floors, key=floors.get, default=None)
        if channel is None or floors[channel] <= step_s:
            return step_s
        parts[channel] = parts.get(channel, 0.0) + floors[channel] - step_s
        return floors[channel]


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
    channels, each at its full rate) without a mixed rate, or with one of at least twice the slower direction's
    rate, where the share would be 1 or more."""
    if mixed is None:
        return None
    fast, slow = max(read, write), min(read, write)
    behind = 2.0 / mixed - 1.0 / slow + 1.0 / fast  # seconds per byte the faster direction runs at its share
    share = 1.0 / (fast * behind) if behind > 0 else float("inf")
    return share if share < 1.0 else None


def channel_rates(machine: Machine, arena_buffers: bool) -> Rates:
    """The machine's rates for a policy whose swap buffers are the arena's (``arena_buffers``: tencache's pinned,
    huge-page slots) or DeepSpeed's (stock: torch.empty memory of 4 KiB pages, not CUDA-registered: its H2D copies
    at the pageable share, its NVMe requests at the machine's ``nvme_small_page_factors``)."""
    h2d = machine.h2d_bytes_per_s * (1.0 if arena_buffers else PAGEABLE_H2D_FACTOR)
    factors = (1.0, 1.0, 1.0) if arena_buffers or machine.nvme_small_page_factors is None \
        else machine.nvme_small_page_factors
    read, write = machine.nvme_read_bytes_per_s_per_rank * factors[0], \
        machine.nvme_write_bytes_per_s_per_rank * factors[1]
    mixed = machine.nvme_mixed_bytes_per_s_per_rank
    return Rates(machine.accelerator_flops_per_s_per_rank, machine.cpu_adam_elements_per_s_per_rank,
                 machine.host_copy_bytes_per_s_per_rank, {"nvme_read": read, "nvme_write": write, "h2d": h2d},
                 mixed_share(read, write, mixed * factors[2] if mixed is not None else None),
                 machine.zero3_module_call_s, machine.nvme_request_factor, machine.io_contention)
