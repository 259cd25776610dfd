"""The host tier's budget while memory changes under a running job. Owns: the rule that turns a reading of the
host's memory into memory to give back or to take again, or into "exhausted". Pure: readings come from
probes/host_memory.py and memory/footprint.py; integrations/deepspeed/memory_pressure.py applies the decisions to the
stores.

At start-up the host tier is fitted to the memory available then (plan/budget.py). Memory can shrink later:
another job on the node grows, a container's limit is lowered. Without a reaction the kernel's OOM killer ends the
run with SIGKILL: no message, and everything since the last checkpoint lost. The host tier is the one part of a
training process's memory that can be given back without changing a result (its bytes are also on file), so it
gives back first; when nothing is left to give and the next step cannot fit, the run stops with the numbers,
between two steps, where a checkpoint can still be saved.

The rule, at every reading (the start of each forward pass: between steps, nothing of the next step allocated):

- ``reserve = floor + ranks × 1.25 × step_rise``: what must stay available on the node so that the next step of
  each of its ranks fits (``step_rise``: how far this process's anonymous memory rose above its level between
  forward passes and update starts, the most over the last few optimizer steps; 1.25: measurement margin) plus a
  floor for everything else on the node (``RESERVE_FLOOR_FRACTION`` of its memory, at least
  ``RESERVE_FLOOR_MIN_BYTES``). Before a step is measured, ``step_rise`` is a prior from the engine's facts
  (``RisePrior``), and memory the engine has allocated but not touched yet (stage 3's gradient bucket on a host
  accelerator) counts too, whole: without them the reserve was the floor alone through the first two steps, and
  "auto"'s start-up share ran the 1.3B model into the OOM killer in its first backward in a 16.5 GiB container
  where stock trains.
- ``available < reserve``: give back twice the shortfall, at most up to ``1.25 × reserve`` (on a prior: the
  shortfall, up to the reserve; each rank its share), at most what the tier can give (``reducible``: its memory
  above the least it needs to stream a step), so that one decision is enough and the next reading lands inside the
  band ``[reserve, 1.5 × reserve)``. Twice: a reading a little short of the reserve (memory that drifted by the
  shortfall) leaves as much again above it; a large one lands in the middle. Not the middle for every shortfall: on
  gpt2-1.3b beyond RAM a reading 10 MiB short gave back 1.45 GiB of the optimizer's 1.5 GiB share (2026-11-30), and
  the steps moved 1.17× the least bytes; with twice the shortfall, 1.03× (docs/benchmarks.md). Where the
  optimizer's state (``optimizer_reducible_bytes``, given first) covers the shortfall but not twice it, only that
  state: it lands inside the band, and the parameter caches stay whole. A cache that gives up a partition costs
  more than its bytes: the fp32 masters are owed to their files only while every partition is held
  (integrations/deepspeed/master_write_behind.py), so from then on each update writes them (4.75 GiB a step on
  gpt2-1.3b).
- ``available ≥ 1.5 × reserve`` and the tier gave memory back earlier: take back the excess over ``1.25 × reserve``
  (each rank its share), at most what it gave. Both land inside the band (a growth in its middle), so the next
  reading holds: shrink and growth never alternate.
- An ``"auto"`` budget also *grows* that way beyond its start-up size, up to what the tier can use
  (``growable``: the optimizer state it does not hold yet), once a step's rise has been measured: "auto" starts
  at a share of the memory available at start-up (given back at the first reading where the prior says the first
  step needs it), then fills what the measured steps leave free. A model whose state does not fit in host memory
  then keeps as much of it as is safe, not a fixed share, with the shrink above as the safety net.
- otherwise hold.
- exhausted: after giving back, the tier has nothing left to give and even with all page cache reclaimed less than
  ``ranks × step_rise`` can be allocated (``allocatable``): the next step would end with the OOM killer. Never on
  the first measured step (it creates the optimizer's state, a rise that does not repeat).

E.g. a 3 GiB cgroup, one rank, a 200 MiB step rise: reserve = 64 MiB floor + 1.25 x 200 MiB = 314 MiB. With 100
MiB available and 800 MiB reducible: give back min(2 x 214, 1.25 x 314 - 100) = 292.5 MiB; with 300 MiB available,
2 x 14 = 28 MiB. Had only 300 MiB been reducible, it gives back those, and if then only 150 MiB can be allocated,
150 < 200: exhausted.
"""
import collections
import dataclasses
import enum
from typing import Deque, List, Optional, Sequence, Tuple

from ..units import fmt_bytes

RESERVE_FLOOR_FRACTION = 0.02            # of the node's (or cgroup's) memory, for everything else running there
RESERVE_FLOOR_MIN_BYTES = 64 * 1024**2   # 64 MiB
# A step's rise varies (sequence lengths, allocator): a margin over the most of the last few steps. Not more: on the
# 1.3B model beyond this machine's RAM the rise is DeepSpeed's 2 GB reduce bucket concatenated (about 4 GiB, within
# 6% step to step), and a margin of 1.5 kept 2 GiB more free than any step used, at the cost of the parameter cache.
STEP_RISE_MARGIN = 1.25
STEP_RISE_WINDOW = 4                     # optimizer steps whose rise counts (the most of them)
BAND_MIDDLE = 1.25                       # decisions aim at available = 1.25 x reserve: inside [reserve, BAND_TOP x)
BAND_TOP = 1.5                           # memory is taken (again) from 1.5 x reserve available


class Action(enum.Enum):
    HOLD = "hold"
    SHRINK = "shrink"
    GROW = "grow"


@dataclasses.dataclass(frozen=True)
class PressureDecision:
    """What to do with this rank's host tier: give back (SHRINK) or take again (GROW) ``nbytes``, and why."""

    action: Action
    nbytes: int = 0
    reason: str = ""


HOLD = PressureDecision(Action.HOLD)


@dataclasses.dataclass(frozen=True)
class RisePrior:
    """What a rank's first steps are expected to take above the memory read before them, until a step is measured:
    ``rise_bytes``, a step's rise (as measured later: transient), and ``untouched_bytes``, memory the engine has
    allocated but not written yet, which the first step makes resident and keeps (a host accelerator's gradient
    bucket), and ``kept_rise_bytes``, a rise the reserve counts even where the measured one is lower."""

    rise_bytes: int = 0
    untouched_bytes: int = 0
    # a rise the reserve keeps counting once steps are measured lower (``stage3_rise_prior``'s ``bucket_unused``)
    kept_rise_bytes: int = 0


NO_PRIOR = RisePrior()


def stage3_rise_prior(accelerator_is_host: bool, gathered_bytes: int, bucket_bytes: int, bucket_allocated: bool,
                      around_bytes: int, largest_sub_group_bytes: int, bucket_unused: bool = False) -> RisePrior:
    """A ZeRO-3 step's rise in host memory before one is measured (DeepSpeed 0.19.8's defaults); the step model
    prices the same moment with it (plan/step_model/costs.py ``device_step_bytes``).

    - The update's temporaries: one fp32 tensor of the largest sub-group (``largest_sub_group_bytes``). An
      assumption: on a GPU, the whole prior (activations and buckets are device memory).
    - On a host accelerator, also a reduce of the gradient bucket: ``reduce_scatter_coalesced`` concatenates the
      bucket's gradients (its fill: ``bucket_bytes``, ``reduce_bucket_size`` elements, or the gathered model's
      ``gathered_bytes`` when smaller) into a new flat buffer and reduces it into another; where the bucket fills
      before the backward ends, beside the two gathered modules around it (``around_bytes`` each). The bucket
      itself (``bucket_allocated``: with ``contiguous_gradients``) is allocated at initialisation and untouched
      until the first backward fills it, after which it stays resident. Measured (fp32, one rank, docs/bench
      ``host_step_rise_bytes``): gpt2-1.3b (a 5e8-element bucket, 1.86 GiB, filled mid-backward; a 65.5 M-element
      embedding around it) rose 3.96 GiB a step, this gives 4.21 GiB; its first backward rose 5.9 GiB above the
      memory read before it, 4.0 GiB in each later one (a trace of 2026-11-29: the bucket, once); gpt2-small (124 M
      elements, one reduce at the backward's end) rose 995.5 MB, this gives 995.5 MB.
    - ``bucket_unused``: tencache partitions each gradient at once (integrations/deepspeed/one_rank_reduce.py: a
      host accelerator, at most two ranks in the partition group), so the reduce takes none of the bucket's buffers
      (at one rank it takes views: gpt2-1.3b then rose 0.44 GiB a step instead of 4 GiB; at two it reduces one
      gradient at a time: 2.56 GiB a rank, docs/reliability.md, "Two ranks beyond RAM"). The reserve still counts
      the reduce's buffers (``kept_rise_bytes``): "auto" would otherwise grow into them, and the memory stock's step
      leaves free between steps is what a user's code there counts on (gathering the fp32 weights after training:
      5.1 GB on gpt2-1.3b, killed by the kernel with 1 GiB left when the tier had grown from 5.7 to 10.6 GiB). The
      step does without the buffers' work; the tier holds what it held. The bucket itself stays untouched: the
      first reading still counts it as ``untouched_bytes``, as it counts the reduce's buffers, memory a stock run
      of the same config holds; the step model prices the same start-up share.
    """
    update = max(0, int(largest_sub_group_bytes))
    if not accelerator_is_host:
        return RisePrior(update)
    fill = min(bucket_bytes, gathered_bytes)
    reduce = 2 * fill + (2 * around_bytes if gathered_bytes > bucket_bytes else 0)
    return RisePrior(max(update, reduce), fill if bucket_allocated else 0, reduce if bucket_unused else 0)


class MemoryPressurePolicy:
    """Decides how much host memory the tier gives back or takes again, from readings of the host's memory.

    Args:
        local_world_size: ranks on this node, which share its memory and each give back their share.
        prior: what the first steps are expected to take before one is measured (none: the floor alone).
    """

    def __init__(self, local_world_size: int = 1, prior: RisePrior = NO_PRIOR):
        self.ranks = max(1, int(local_world_size))
        self.prior = prior
        self._rises: Deque[int] = collections.deque(maxlen=STEP_RISE_WINDOW)
        self._measured_steps = 0
        self._first_reading_done = False
        # the largest step rise any rank expects (the governor agrees it at each reading): the node's ranks each
        # keep room for it, so no rank grows into what another's larger rise needs
        self.agreed_rise_bytes = 0

    def observe_step_rise(self, rise_bytes: Optional[int]) -> None:
        """How far anonymous memory rose during the step that just ended (None: not measured). The first measured
        step is the optimizer's first, whose state creation does not repeat: it is not kept."""
        if rise_bytes is None:
            return
        self._measured_steps += 1
        if self._measured_steps > 1:
            self._rises.append(max(0, int(rise_bytes)))

    @property
    def step_rise_bytes(self) -> int:
        """The most any of the last steps rose (0 before one is measured)."""
        return max(self._rises, default=0)

    @property
    def expected_rise_bytes(self) -> int:
        """A step's rise as the reserve counts it: the measured one, or the prior's until one is kept; at least the
        prior's ``kept_rise_bytes``."""
        return max(self.step_rise_bytes if self._rises else self.prior.rise_bytes, self.prior.kept_rise_bytes)

    @property
    def untouched_bytes(self) -> int:
        """The prior's memory allocated but not touched yet, at the first reading only: the first backward makes
        it resident, and every later reading sees it (with gradient accumulation the next reading comes before the
        first step ends: counted there too, it was given back twice). A forward pass without a backward first
        (an evaluation) leaves its reading's give-back in place, which the next reading's band holds."""
        return 0 if self._first_reading_done else self.prior.untouched_bytes

    @property
    def next_step_bytes(self) -> int:
        """What the next step is expected to take above the level read before it."""
        return self.expected_rise_bytes + self.untouched_bytes

    def reading_done(self) -> None:
        """A reading was decided (the governor calls this once per forward pass)."""
        self._first_reading_done = True

    def reserve_bytes(self, total_bytes: int) -> int:
        floor = max(RESERVE_FLOOR_MIN_BYTES, int(total_bytes * RESERVE_FLOOR_FRACTION))
        # memory allocated but untouched is taken by the first step whole: no margin on it
        return floor + int(STEP_RISE_MARGIN * self._node_rise_bytes + self.ranks * self.untouched_bytes)

    @property
    def _node_rise_bytes(self) -> int:
        """What a step of every rank on the node may rise: the largest rise any rank expects (agreed: rank 0's 16-bit
        save, say) for each of them, the same reserve on every rank of the node (helper-233: the largest once beside
        this rank's own for the others gave the rank with the largest rise the largest reserve, and the others took
        what it gave back, reading after reading). Alone on its node, its own: a larger rise is another node's
        (helper-232). Where one rank's rise is the largest, the others' share of the node is kept for it too."""
        own = self.expected_rise_bytes
        return own if self.ranks == 1 else self.ranks * max(own, self.agreed_rise_bytes)

    def decide(self, total_bytes: int, available_bytes: int, reducible_bytes: int,
               given_back_bytes: int, growable_bytes: int = 0,
               optimizer_reducible_bytes: Optional[int] = None, promised_bytes: int = 0) -> PressureDecision:
        """After a reading of ``available_bytes`` of the node's (or cgroup's) ``total_bytes``, ``promised_bytes`` of
        it counted as taken (what the tiers will still fill, which no reading shows yet), with this rank's
        tier able to give back ``reducible_bytes`` (``optimizer_reducible_bytes`` of it optimizer state, which goes
        first; None: all of it), having given back ``given_back_bytes`` net so far (negative: grown beyond its
        start), and able to use ``growable_bytes`` more than its start-up size ("auto" only)."""
        # the reading as read, in what the decision says (the net could be below zero: "-2.82 GiB available" at 2
        # ranks on gpt2-2.7b, 2026-12-06), and net of the promises in what it decides
        read = f"{fmt_bytes(available_bytes)} of {fmt_bytes(total_bytes)} available" + (
            f" ({fmt_bytes(promised_bytes)} of it promised to the optimizer tier's next updates)"
            if promised_bytes else "")
        available_bytes -= promised_bytes
        reserve = self.reserve_bytes(total_bytes)
        middle = int(BAND_MIDDLE * reserve)
        if available_bytes < reserve:
            # on a prior, up to the reserve only: it has its margin, and the band's would outlast the prior (the
            # next readings hold inside a band the measured rise lowers): on gpt2-1.3b beyond RAM the first reading
            # gave 2.1 GiB back to the middle and the steps stayed 43 s instead of 31 s
            target = reserve if self._on_prior else min(middle, reserve + (reserve - available_bytes))
            give = -(-(target - available_bytes) // self.ranks)
            optimizer_share = give if optimizer_reducible_bytes is None else max(0, optimizer_reducible_bytes)
            if optimizer_share < give and optimizer_share >= -(-(reserve - available_bytes) // self.ranks):
                give = optimizer_share  # the reserve reached with optimizer state alone: the caches stay whole
            give = min(max(0, reducible_bytes), give)
            if give <= 0:
                return HOLD
            return PressureDecision(Action.SHRINK, give, self._describe(
                f"{read}, below the {fmt_bytes(reserve)} kept available for the next step and the rest of the node",
                "gives back", give))
        if available_bytes >= int(BAND_TOP * reserve):
            # growing past the start needs a measured step rise: before that the reserve knows only the prior
            room = max(0, given_back_bytes) + (max(0, growable_bytes) if self._rises else 0)
            take = min(room, (available_bytes - middle) // self.ranks)
            if take > 0:
                verb = "takes back" if take <= given_back_bytes else "takes"
                return PressureDecision(Action.GROW, take, self._describe(read, verb, take))
        return HOLD

    def exhausted(self, total_bytes: int, allocatable_bytes: int, reducible_bytes: int,
                  start_budget_bytes: int) -> Optional[str]:
        """Why the next step cannot fit, or None: the tier has nothing more to give and less than a step's rise
        (each rank's) can be allocated even with all page cache reclaimed."""
        if reducible_bytes > 0 or not self._rises:
            return None
        needed = self.ranks * self.step_rise_bytes
        if allocatable_bytes >= needed:
            return None
        per_rank = "" if self.ranks == 1 else f" x {self.ranks} ranks on this node"
        return (f"host memory: {fmt_bytes(allocatable_bytes)} of {fmt_bytes(total_bytes)} can be allocated (page "
                f"cache included), but a training step needs {fmt_bytes(self.step_rise_bytes)}{per_rank} above its "
                f"level between steps (measured); tencache's host tier has nothing more to give back (its budget: "
                f"{fmt_bytes(start_budget_bytes)} at start-up; what is left streams one step), so the next step "
                f"would end with the OOM killer (or, where the kernel may swap this memory, in swapping: swap is not "
                f"counted)")

    @property
    def _on_prior(self) -> bool:
        """No rise kept yet, and a prior stands in for it."""
        return not self._rises and self.prior != NO_PRIOR

    def _describe(self, why: str, verb: str, nbytes: int) -> str:
        if self._on_prior:
            rise = f"; a step is expected to rise {fmt_bytes(self.prior.rise_bytes)} (not measured yet)"
            rise += f", the first one {fmt_bytes(self.untouched_bytes)} more" if self.untouched_bytes else ""
        else:
            rise = f"; a step rises {fmt_bytes(self.step_rise_bytes)}" if self.step_rise_bytes else ""
            if self.prior.kept_rise_bytes > self.step_rise_bytes:  # what the reserve counts instead
                rise += (f" (counted as {fmt_bytes(self.prior.kept_rise_bytes)}, the buffers of stage 3's own reduce, "
                         f"which tencache's does without)")
        ranks = "" if self.ranks == 1 else f" (this rank's share of {self.ranks})"
        return f"{why}{rise}: the host tier {verb} {fmt_bytes(nbytes)}{ranks}"


def give_back_split(nbytes: int, optimizer_reducible: int, caches_reducible: Sequence[int]) -> Tuple[int, List[int]]:
    """How a give-back of ``nbytes`` falls on the tier: optimizer state first (a byte held saves a read and a write
    a step; a parameter cache byte saves two reads and a write), up to ``optimizer_reducible``, then each parameter
    cache in turn, up to what it can give. E.g. 1 GiB with 300 MiB of optimizer state and caches of 500 and 500 MiB
    reducible: (300 MiB, [500 MiB, 224 MiB])."""
    optimizer_cut = min(max(0, nbytes), max(0, optimizer_reducible))
    left, cuts = nbytes - optimizer_cut, []
    for reducible in caches_reducible:
        cut = max(0, min(left, reducible))
        cuts.append(cut)
        left -= cut
    return optimizer_cut, cuts
