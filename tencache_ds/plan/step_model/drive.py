"""The step model's drive: NVMe requests in flight, sharing it. Owns: which requests are moving at each instant and
how fast (a fluid simulation, advanced as the replay's clock moves on). Does not own: the clock, the rates a
request's work comes from, or what waits for it (timeline.py). Pure.

Each store (parameters, optimizer state) issues through its own engine, so requests queue per store and direction
(``Request.queue``), one moving at a time at the head of each queue, in the order issued. A head moves once the
write it reads back (``Request.after``: a tensor read while its write is still queued) is done. The heads share the
drive: each direction's capacity (1: a request alone moves at its own rate) is split evenly among its moving
heads, and where both directions have a moving head each direction gets ``mixed_share`` of it (equal bytes read and
written at once then move at the machine's mixed rate, timeline.mixed_share); without a mixed rate each direction
is its own channel with a capacity of 1. A request's ``work`` is its seconds alone: its bytes at the rate for its
size.

The clock only moves forward and requests are added at its current time, so the drive can be advanced exactly: a
request's end is known once the clock is past it, and ``finish`` runs the drive on (with nothing more added: the
replay's thread is waiting, and goes on from the request's end) until a request is done. A request added before
the time the drive was run to is refused: the drive would have run without it.
"""
import dataclasses
import math
from collections import defaultdict, deque
from typing import Deque, Dict, Iterable, List, Optional

DONE_EPSILON_S = 1e-12  # work left below this is done (floating point of many partial advances)


@dataclasses.dataclass(eq=False)
class Request:
    """One NVMe request: ``work`` seconds alone left to move; ``done`` when it ended (None while it moves)."""

    queue: str
    channel: str
    work: float
    after: Optional["Request"] = None
    done: Optional[float] = None


class Drive:
    """The requests not yet done, per queue, and the time the drive has been advanced to."""

    def __init__(self, mixed_share: Optional[float] = None):
        if mixed_share is not None and not 0.0 < mixed_share < 1.0:
            raise ValueError(f"a drive's mixed share is above 0 and below 1 (None: separate channels), not "
                             f"{mixed_share}")
        self.mixed_share = mixed_share
        self.queues: Dict[str, Deque[Request]] = defaultdict(deque)
        self.time = 0.0

    def add(self, request: Request, now: float) -> Request:
        if now < self.time - 1e-9:
            raise ValueError(f"a request added at {now} s to a drive already run to {self.time} s")
        if not math.isfinite(request.work) or request.work < 0:
            raise ValueError(f"a request's work is finite and not negative, not {request.work} s")
        self.advance(now)
        self.queues[request.queue].append(request)
        return request

    def finish(self, request: Request) -> float:
        """When ``request`` is done, the drive advanced to then (nothing is added meanwhile)."""
        while request.done is None:
            if not self._step(None):
                raise RuntimeError(f"a {request.channel} request on queue {request.queue} is not on the drive, or "
                                   "can never move (the write it waits for is not)")
        return request.done

    def advance(self, to: float) -> float:
        """Run the drive until ``to``; returns the seconds of it in which a request was moving."""
        busy = 0.0
        while self.time < to:
            before = self.time
            moving = self._step(to)
            if moving:
                busy += self.time - before
            else:
                self.time = to
        return busy

    def _step(self, limit: Optional[float]) -> bool:
        """Move the heads until the first of them is done or ``limit``; False when none can move."""
        rates = self._rates()
        if not rates:
            return False
        seconds = min(request.work / rate for request, rate in rates.items())
        if limit is not None:
            seconds = min(seconds, limit - self.time)
        self.time += seconds
        for request, rate in rates.items():
            request.work -= rate * seconds
            if request.work <= DONE_EPSILON_S:
                request.work, request.done = 0.0, self.time
                self.queues[request.queue].popleft()
        return True

    def _rates(self) -> Dict[Request, float]:
        """Each moving head's share of its own rate."""
        heads: Dict[str, List[Request]] = defaultdict(list)
        for queue in self.queues.values():
            if queue and (queue[0].after is None or queue[0].after.done is not None):
                heads[queue[0].channel].append(queue[0])
        capacity = self.mixed_share if len(heads) > 1 and self.mixed_share is not None else 1.0
        return {request: capacity / len(requests) for requests in heads.values() for request in requests}

    def pending(self) -> Iterable[Request]:
        for queue in self.queues.values():
            yield from queue


def drive_floor(read_s: float, write_s: float, mixed_share: Optional[float]) -> float:
    """The least time a drive needs for ``read_s`` and ``write_s`` seconds of work alone: the two side by side
    where they do not slow each other (no mixed share), else the overlap at the share (or in turn, where that is
    faster: below a share of 0.5), the rest alone. E.g. 10 s and 4 s at 0.8: 10 + 4 x (1 / 0.8 - 1) = 11 s."""
    longer, shorter = max(read_s, write_s), min(read_s, write_s)
    if mixed_share is None:
        return longer
    return longer + shorter * (1.0 / max(mixed_share, 0.5) - 1.0)
