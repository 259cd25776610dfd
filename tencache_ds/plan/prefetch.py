"""Prefetch planning: how far ahead each NVMe read must be issued to be done before its tensor is used. Owns: the
lead of every access of a step profile, their growth from late-read feedback, the bound on bytes in flight, the
predicted step time and the I/O bound. Pure: no clock, no I/O. Does not own: which accesses need a read (the host
tier: plan/host_residency.py predicts it, the store knows it), issuing reads (the consumer), eviction and the rule
that a read which would evict a tensor needed sooner is not issued (plan/eviction.py, applied by
cache/entry_store.py).

What a consumer calls::

    schedule = PrefetchSchedule.from_profile(profile, read_bytes_per_s=2e9, in_flight_budget_bytes=1 << 30,
                                             reads_at=None)  # positions that read NVMe; None: every access
    # re-plan when the profile is replaced (ProfileLifecycle.generation changes)
    # at access `position` (the index StepRecorder.touch returned), while the lifecycle's phase is PREDICTING,
    # before waiting for the access's own read:
    for target in schedule.to_issue(position):   # each target once per step, soonest needed first
        read(profile.keys[target])                # this step's access if target > position, else the next step's
    # when access `position` had to wait for a read issued ahead:
    schedule.late(position, late_s=waited)        # grows its lead from the next step on
    schedule.leads[position], schedule.predicted_step_s, schedule.io_bound_s (= max(compute_s, read_s))
    schedule.tail_reads   # within_step: the reads to start in the previous step's tail (see from_profile)
    eviction.worth_evicting(victim_next_use, incoming_next_use)  # plan/eviction.py: before evicting for a prefetch

The model (what "predicted" means):
- The step repeats. Access ``i`` is preceded by its gap's compute time (profile.gap_compute_s; the gap before
  access 0 also holds the previous step's tail), and waits for its read if that is not done.
- A read takes ``nbytes / read_bytes_per_s``; with no bandwidth given, its measured time in the profile (the
  profile's measured bandwidth for accesses it did not read). Reads share one channel in issue order: a device
  delivering its bandwidth.
- The lead of access ``i`` is ``L``: its read is issued when access ``i - L`` happens (of the previous step when
  negative). 0: not prefetched (read on demand, or no read needed). A prefetched read holds ``nbytes`` of buffer
  from issue to use; at every position the bytes held so are at most ``in_flight_budget_bytes``.
- A read is issued after the previous access of the same tensor (never while it is in use, at most a step ahead).

Planning: each read first gets the smallest lead whose compute covers its duration, all reads growing one access
per round while the budget allows (so a tight budget prefetches every read a little rather than some deep and the
rest on demand). Then the step is replayed (REPLAY_LAPS steps, the last one measured) and every read that arrived
late has its lead grown by the compute that covers its lateness, as far as the budget and the previous access
allow; repeated while that shortens the predicted step (the best plan seen is kept).
"""
import math
from typing import Dict, Iterable, List, Optional, Tuple

from ..profile.step_profile import StepProfile

REPLAY_LAPS = 4       # steps replayed per prediction: the first starts cold, the last is measured (steady state)
MAX_PLAN_ROUNDS = 16  # replay -> grow the late reads -> replay ...; the best plan seen is kept
PATIENCE_ROUNDS = 2   # rounds in a row without a shorter step before planning stops


class PrefetchSchedule:
    """Leads for the accesses of one step profile (see the module docstring for the model).

    Invariants: ``leads[i] == 0`` or ``1 <= leads[i] <= cap(i)`` (issued after the key's previous access); a
    position with lead > 0 needs a read; ``in_flight_bytes[p]`` (bytes issued at or before access ``p`` and used
    after it) never exceeds the budget; ``to_issue(p)`` lists exactly the accesses ``i`` with
    ``(i - leads[i]) % n == p`` and ``leads[i] > 0``.

    Args:
        profile: the step.
        read_seconds: seconds of the read of each access that reads NVMe ({position: seconds}).
        read_bytes_per_s: for reads found late at run time at positions not planned to read.
        in_flight_budget_bytes: buffer bytes for reads issued and not yet used (None: unbounded).
    """

    def __init__(self, profile: StepProfile, read_seconds: Dict[int, float], read_bytes_per_s: float,
                 in_flight_budget_bytes: Optional[int] = None, within_step: bool = False):
        self.profile = profile
        self._n = n = len(profile)
        self._read_bytes_per_s = read_bytes_per_s
        self._budget = math.inf if in_flight_budget_bytes is None else in_flight_budget_bytes
        gaps = profile.gap_compute_s()
        self._gap_s = [gaps[0] + gaps[n]] + gaps[1:n] if n else []  # steady state: the tail precedes access 0
        self._read_seconds = dict(read_seconds)
        self._cap = _issue_caps(profile.keys)
        if within_step:  # issued at access 1 or later of the same step: see from_profile
            self._cap = [min(cap, max(0, position - 1)) for position, cap in enumerate(self._cap)]
        self.leads: List[int] = [0] * n
        self.in_flight_bytes: List[int] = [0] * n
        self._issue_at: List[List[int]] = [[] for _ in range(n)]
        self.compute_s = sum(gaps)
        self.read_bytes = sum(profile.nbytes[i] for i in self._read_seconds)
        self.read_s = sum(self._read_seconds.values())  # the channel's busy time per step
        self.io_bound_s = max(self.compute_s, self.read_s)
        self.predicted_step_s = self._plan()
        self.tail_reads: Tuple[int, ...] = self._reads_cut_short() if within_step else ()

    @classmethod
    def from_profile(cls, profile: StepProfile, read_bytes_per_s: Optional[float] = None,
                     in_flight_budget_bytes: Optional[int] = None, reads_at: Optional[Iterable[int]] = None,
                     within_step: bool = False) -> "PrefetchSchedule":
        """Plan ``profile``'s reads.

        Args:
            read_bytes_per_s: the read bandwidth; None: the reads' measured times (ValueError if there are reads
                to plan and the profile measured none).
            in_flight_budget_bytes: buffer bytes for reads in flight (None: unbounded).
            reads_at: positions whose access reads NVMe (None: every access; plan/host_residency.py predicts
                them for a host tier).
            within_step: every read is issued in the step that uses it, at its access 1 or later: parameter
                partitions, which the optimizer step rewrites before the next step (a read issued in the step
                before would read the old bytes, so the consumer never issues one), and whose first read ahead
                comes once the step's first use is recorded. Without it the first accesses' leads reach into
                the previous step's tail (its optimizer step, the longest gap), where none of them is issued.
                ``tail_reads`` then lists the reads that cap leaves late (each at the first access of its tensor
                in the step, its lead as long as the step allows, late in the replay), soonest needed first: a
                consumer that can start them in that tail once their tensors' new bytes are on file (the
                parameter swapper, during the optimizer step) does so.
        """
        positions = range(len(profile)) if reads_at is None else sorted(set(reads_at))
        if read_bytes_per_s is None and not positions:
            read_bytes_per_s = math.inf  # nothing to read: no bandwidth needed (a late read later counts 0 s)
        if read_bytes_per_s is None:
            read_bytes_per_s = profile.measured_read_bytes_per_s
            if read_bytes_per_s is None:
                raise ValueError("no read bandwidth given and the profile has no measured reads")
            seconds = {i: profile.read_s[i] if profile.read_s[i] is not None
                       else profile.nbytes[i] / read_bytes_per_s for i in positions}
        else:
            if read_bytes_per_s <= 0:
                raise ValueError(f"read bandwidth must be positive, got {read_bytes_per_s}")
            seconds = {i: profile.nbytes[i] / read_bytes_per_s for i in positions}
        return cls(profile, seconds, read_bytes_per_s, in_flight_budget_bytes, within_step)

    # ------------------------------------------------------------------------------------------ consumer API
    def to_issue(self, position: int) -> Tuple[int, ...]:
        """Accesses whose reads are issued when access ``position`` happens (of the next step if < position)."""
        if 0 <= position < self._n:
            return tuple(self._issue_at[position])
        return ()

    def late(self, position: int, late_s: Optional[float] = None) -> int:
        """Access ``position`` waited for its read (``late_s`` seconds, if known): issue it earlier from now on,
        by the compute that covers ``late_s`` (one access if unknown), as far as the budget and the previous
        access of the same tensor allow. An access not planned to read starts being prefetched. Returns its lead.
        ``predicted_step_s`` stays the plan's."""
        if not 0 <= position < self._n:
            return 0
        if position not in self._read_seconds:
            self._read_seconds[position] = self.profile.nbytes[position] / self._read_bytes_per_s
        self._grow(position, late_s)
        return self.leads[position]

    def issue_position(self, position: int) -> Optional[int]:
        """Where access ``position``'s read is issued (None: not prefetched)."""
        lead = self.leads[position]
        return (position - lead) % self._n if lead else None

    def _reads_cut_short(self) -> Tuple[int, ...]:
        """Within the step: the positions whose reads arrive late because the step begins too close before them
        (their lead is at the cap, the tensor's first access in the step), in position order."""
        _step_s, late = self.replay()
        first: Dict[object, int] = {}
        for position, key in enumerate(self.profile.keys):
            first.setdefault(key, position)
        return tuple(position for position in sorted(late)
                     if first[self.profile.keys[position]] == position and self.leads[position] == self._cap[position])

    # ------------------------------------------------------------------------------------------- planning
    def _plan(self) -> float:
        # Water-filling: every read one access further per round, until its compute covers it, so that a tight
        # budget prefetches every read a little before it prefetches some deep and leaves others on demand.
        covered = {position: 0.0 for position in self._read_seconds}
        wanting = sorted(covered)
        while wanting:
            still = []
            for position in wanting:
                if self._grow(position, None):
                    covered[position] += self._gap_s[(position - self.leads[position] + 1) % self._n]
                    if covered[position] < self._read_seconds[position]:
                        still.append(position)
            wanting = still
        best_s, late = self.replay()
        best_leads, stale_rounds = list(self.leads), 0
        for _round in range(MAX_PLAN_ROUNDS):
            if not [position for position in sorted(late) if self._grow(position, late[position])]:
                break
            step_s, late = self.replay()
            if step_s < best_s:
                best_s, best_leads, stale_rounds = step_s, list(self.leads), 0
            else:
                stale_rounds += 1  # one read issued earlier can delay others behind it: they grow next round
                if stale_rounds > PATIENCE_ROUNDS:
                    break
        for position, lead in enumerate(best_leads):  # shorter leads first: the best plan's bytes fit again
            if lead < self.leads[position]:
                self._set_lead(position, lead)
        for position, lead in enumerate(best_leads):
            if lead > self.leads[position]:
                self._set_lead(position, lead)
        return best_s

    def _grow(self, position: int, cover_s: Optional[float]) -> bool:
        """Lengthen ``position``'s lead until it gains ``cover_s`` of compute (None: by one), as far as the budget
        and the previous access allow; False if it cannot grow at all."""
        n, nbytes = self._n, self.profile.nbytes[position]
        old = lead = self.leads[position]
        gained = 0.0
        while lead < self._cap[position] and \
                self.in_flight_bytes[(position - lead - 1) % n] + nbytes <= self._budget:
            lead += 1
            gained += self._gap_s[(position - lead + 1) % n]  # the gap between the new and the old issue points
            if cover_s is None or gained >= cover_s:
                break
        if lead != old:
            self._set_lead(position, lead)
        return lead != old

    def _set_lead(self, position: int, new: int) -> None:
        """Move ``position``'s issue point, keeping ``in_flight_bytes`` and the issue lists in step (no checks)."""
        n, nbytes, old = self._n, self.profile.nbytes[position], self.leads[position]
        for step in range(min(old, new), max(old, new)):
            self.in_flight_bytes[(position - step - 1) % n] += nbytes if new > old else -nbytes
        if old:
            self._issue_at[(position - old) % n].remove(position)
        self.leads[position] = new
        if new:
            issue = (position - new) % n
            self._issue_at[issue].append(position)
            self._issue_at[issue].sort(key=lambda target: (target - issue) % n)  # soonest needed first

    def replay(self) -> Tuple[float, Dict[int, float]]:
        """Replay the step under the current leads: (the steady step's seconds, {position: seconds its access
        waited for its read})."""
        n, gap_s, seconds = self._n, self._gap_s, self._read_seconds
        now = channel_free = step_start = 0.0
        done_at: Dict[Tuple[int, int], float] = {}  # (step, position) -> its prefetched read's completion
        late: Dict[int, float] = {}
        for lap in range(REPLAY_LAPS):
            step_start, measured = now, lap == REPLAY_LAPS - 1
            for position in range(n):
                now += gap_s[position]
                ready = None
                if position in seconds:
                    ready = done_at.pop((lap, position), None)
                    if ready is None:  # not prefetched (or not yet, in the cold first step): read on demand
                        channel_free = ready = max(channel_free, now) + seconds[position]
                for target in self._issue_at[position]:
                    channel_free = max(channel_free, now) + seconds[target]
                    done_at[(lap if target > position else lap + 1, target)] = channel_free
                if ready is not None and ready > now:
                    if measured:
                        late[position] = ready - now
                    now = ready
        return now - step_start, late


def _issue_caps(keys) -> List[int]:
    """Per access, the longest lead that issues its read after the previous access of the same key (cyclic);
    e.g. keys [a, b, a]: a at 2 follows a at 0, cap 1; b, alone, cap 2 (n - 1)."""
    n = len(keys)
    positions: Dict[object, List[int]] = {}
    for position, key in enumerate(keys):
        positions.setdefault(key, []).append(position)
    caps = [0] * n
    for occurrences in positions.values():
        for index, position in enumerate(occurrences):
            previous = occurrences[index - 1] if index else occurrences[-1] - n
            caps[position] = position - previous - 1
    return caps
