"""The host tier while the host's memory changes under a running job. Owns: reading the host's memory at the start
of every forward pass (between steps: nothing of the next step is allocated yet, and the engine's own bookkeeping
of the last step is done), applying what plan/memory_pressure.py decides to the stores, and stopping the run with
TencacheOutOfMemory when nothing is left to give and the next step cannot fit. The numbers come from
probes/host_memory.py and memory/footprint.py; the stores do the evicting (cache/).

What the tier can give back: the parameter cache's slots, and the optimizer state it keeps beyond the streaming
slots one update needs anyway (whatever it stops keeping streams through those). It fills with parameter
partitions first (plan/host_tier.py: they save more I/O per byte), so it gives back optimizer state first and takes
parameter slots back first. Where the device is host memory (the CPU accelerator) the device tier's residents are
partitions the parameter store has lent: the tier is refitted before the store shrinks, and after it grows.

Every rank passes here at every forward pass, in the same order, so this is where ranks agree (agreement.py): on the
device tier's budget (each rank proposes one from its own readings; the smallest is applied everywhere, since which
parameters the tier keeps decides which all-gathers run), and on stopping (a rank out of memory stops every rank,
each with the message, instead of leaving the others waiting in their next collective). The host tier's own budget
stays each rank's: it decides only this rank's file I/O.
"""
import functools
import logging
import threading
import weakref
from typing import Callable, List, Optional

from ...config import AUTO
from ...errors import TencacheOutOfMemory
from ...log import logger
from ...memory.footprint import StepRiseMeter
from ...probes.limits import local_world_size, ranks_on_node_known
from ...probes.host_memory import HostMemory, read_host_memory
from ...plan.memory_pressure import (HOLD, NO_PRIOR, Action, MemoryPressurePolicy, RisePrior, give_back_split,
                                     stage3_rise_prior)
from ...units import fmt_bytes
from .agreement import agree_min

GOVERNOR_ATTRIBUTE = "_tencache_host_governor"  # on the ZeRO-3 optimizer: its HostTierGovernor (reporting.py)
# Every governor of this process that is not closed (one per engine): before a growth, a reading counts what all of
# them promised, so that engines alive at once (DeepSpeed-Chat's actor and critic, each "auto") never promise the
# same free memory to two growths (each growth is filled only at its engine's next update, and the other engine
# may read first). Only growth: another engine's unfilled promise does not make this one give memory back.
_LIVE_GOVERNORS = weakref.WeakSet()
_LIVE_GOVERNORS_LOCK = threading.Lock()  # an engine may be built on another thread while one reads
REMEDY = "free memory on this node, lower the micro batch size, or turn on activation checkpointing"
# What a checkpoint saved after the stop holds, by where the forward pass is in the gradient accumulation window
BETWEEN_STEPS = "the engine is between two steps: a checkpoint saved now (engine.save_checkpoint) is complete"
WITHIN_WINDOW = ("the engine is within a gradient accumulation window ({done} of its {window} micro-batches done): a "
                 "checkpoint saved now (engine.save_checkpoint) holds the last step's weights and optimizer state, "
                 "not this window's gradients")
WINDOW_UNKNOWN = ("a checkpoint saved now (engine.save_checkpoint) holds the last step's weights and optimizer state, "
                  "not the gradients of micro-batches since")


class HostTierGovernor:
    """Keeps one engine's host tier (its parameter stores, its optimizer store, its device tier) within what the
    host's memory allows, reading it before every forward pass.

    Args:
        param_swappers: tencache's parameter swappers of the engine (none when parameters are not on NVMe).
        optimizer_swapper: tencache's optimizer swapper, or None.
        coordinator: the engine's TencacheCoordinator, or None.
        prior: what the first steps are expected to take before one is measured (``stage3_prior``).
    """

    def __init__(self, param_swappers: List, optimizer_swapper, coordinator,
                 read_memory: Callable[[], HostMemory] = read_host_memory,
                 agree: Callable[[List[int]], List[int]] = agree_min, prior: RisePrior = NO_PRIOR):
        self._param_swappers = list(param_swappers)
        self._optimizer = optimizer_swapper
        self._coordinator = coordinator
        self._read_memory = read_memory
        self._agree = agree  # element-wise minimum over ranks
        # (a guessed count, every rank of the job, would multiply the reserve by the nodes: the swappers counted)
        self.policy = MemoryPressurePolicy(local_world_size() if ranks_on_node_known() else 1, prior)
        self.meter = StepRiseMeter()
        self.last_memory: Optional[HostMemory] = None
        self._step_rise: Optional[int] = None  # the most any reading of the current optimizer step rose
        self._step_ended = False  # an optimizer step ended; the next reading still belongs to it
        # Optimizer streaming slots in use at the last step's end, and whether a whole step at the present footprint
        # brought none back (then those still retired stay so: fewer tensors stream at once than planned)
        self._slots_at_step_end: Optional[int] = None
        self._slots_settled = False
        self.given_back_bytes = 0      # SUM: net bytes given back so far (what growing may take again)
        self.start_budget_bytes: Optional[int] = None  # at the first reading, once every slot is planned
        self._optimizer_target = self._optimizer_start = 0  # the optimizer's footprint: as last set, at start-up
        # "auto": the tier grows into the memory the measured steps leave free (plan/memory_pressure.py)
        self.fills_free_memory = optimizer_swapper is not None and optimizer_swapper.config.host_cache_bytes == AUTO
        self.shrinks = 0  # COUNT: readings that gave memory back
        self.grows = 0    # COUNT: readings that took memory again
        self.rise_boundaries = 0  # COUNT: the rise meter's boundaries (before every forward pass and update)
        with _LIVE_GOVERNORS_LOCK:
            _LIVE_GOVERNORS.add(self)

    @property
    def budget_bytes(self) -> int:
        """The host tier's cache budget now: parameter cache slots plus the optimizer's budget for kept state."""
        budget = sum(swapper.store.cache_bytes_reserved for swapper in self._param_swappers)
        return budget + (self._optimizer.budget.total_bytes if self._optimizer is not None else 0)

    def reducible_bytes(self) -> int:
        """What the tier can give back: committed parameter cache slots, and optimizer memory above the least it
        streams an update through."""
        return self._optimizer_reducible_bytes() + sum(swapper.store.reducible_cache_bytes
                                                       for swapper in self._param_swappers)

    def _optimizer_reducible_bytes(self) -> int:
        """Optimizer memory above the least it streams an update through (0 without an optimizer store), counting
        the footprint it is planned to fill (``_optimizer_footprint``), and at most its budget: a give-back takes
        kept buffers and budget not filled yet, never streaming slots brought back beyond the least (no reads
        ahead, a slow drive: OptimizerStore.resize_host_footprint retires slots only where it keeps everything).
        Counted, they were given back at every reading with nothing released, and the run never stopped with
        TencacheOutOfMemory before the OOM killer came (helper-148's review)."""
        if self._optimizer is None:
            return 0
        above_least = max(0, self._optimizer_footprint() - self._optimizer.least_host_footprint_bytes())
        return min(above_least, self._optimizer.budget.total_bytes)

    def _optimizer_footprint(self) -> int:
        """The optimizer's footprint once what it is set to fill is filled (``_promised_bytes``): at the first
        reading, before any update, it holds little of its budget, and giving back cuts that promise first, not
        parameter cache slots (on gpt2-1.3b beyond RAM the first reading took 2.1 GiB of the parameter cache, and
        the steps took 43 s instead of 31 s)."""
        return self._optimizer.host_footprint_bytes() + self._promised_bytes()

    def growable_bytes(self) -> int:
        """What the optimizer store could still take beyond its start-up footprint: the state it does not hold
        (0 unless the budget is "auto")."""
        if not self.fills_free_memory:
            return 0
        return max(0, self._optimizer.footprint_keeping_everything_bytes()
                   - max(self._optimizer_target, self._optimizer_start))

    def _promised_bytes(self) -> int:
        """Memory the optimizer tier's plan will still take that no reading shows yet, counted as taken (any
        budget: an explicit one fills during the first updates too; until 2026-11-29 only "auto"'s counted, and a
        give-back that cut an explicit budget's promise freed nothing the reading had seen), so that the same free
        memory is not promised twice:
        - budget not filled yet: a growth promises it to the next update, and several forward passes can come
          first (gradient accumulation, eval passes, a checkpoint load that dropped what was held, another engine's
          forward pass: every governor's promises count before a growth, ``_decide``). Only what the
          state can fill: a budget larger than the state leaves room no update will take.
        - streaming slots planned but not brought back yet: they come back one by one as sub-groups first stream,
          over the first steps (reads ahead start once the profile predicts). Measured on the 1.3B model beyond
          this machine's RAM: 1.9 of its 3.0 GiB of slots were still to come when "auto" grew by 2.4 GiB, so
          available memory fell by 4.6 GiB and the growth was given back at the next reading. Until a whole step
          at the present footprint brings none back: fewer tensors stream at once than planned, and the rest
          never come."""
        optimizer = self._optimizer
        if optimizer is None:
            return 0
        budget = optimizer.budget
        unfilled = max(0, min(budget.total_bytes, optimizer.state_bytes()) - budget.used_bytes)
        if self._slots_settled:
            return unfilled
        planned_slots = optimizer.planned_host_footprint_bytes() - budget.total_bytes
        return unfilled + max(0, planned_slots - self._slots_in_use())

    def _slots_in_use(self) -> int:
        """The optimizer's streaming slots brought into use (its footprint beyond what its budget holds)."""
        return self._optimizer.host_footprint_bytes() - self._optimizer.budget.used_bytes

    def _note_slots_at_step_end(self) -> None:
        if self._optimizer is None:
            return
        slots = self._slots_in_use()
        self._slots_settled = self._slots_at_step_end is not None and slots <= self._slots_at_step_end
        self._slots_at_step_end = slots

    def _footprint_changed(self) -> None:
        """Given back: more tensors may stream at once, so slots may come back again and the count starts over."""
        self._slots_at_step_end, self._slots_settled = None, False

    def before_forward(self, micro_batches_done: Optional[int] = 0, window: int = 1) -> None:
        """A reading, and what follows from it. Raises TencacheOutOfMemory when the next step cannot fit; its message
        says what a checkpoint saved then holds: the forward pass comes after ``micro_batches_done`` of the
        gradient accumulation window's ``window`` micro-batches (None: not known)."""
        # Every rank makes the same three collectives below whatever happens on it: a rank whose own work fails (its
        # start-up plan included) votes to stop, and raises its error once every rank knows (instead of leaving them
        # waiting). The first: every rank of the job past its update before any reads the node's memory (with NCCL
        # the update's last collective only queues work, and a rank read its memory while another on the node still
        # held its update's temporaries: a shrink, then a growth back: helper-208). One rank: none. It carries the
        # largest step rise any rank expects, which the reserve of every rank sharing a node counts (helper-229: a
        # rank whose own rise was small, beside rank 0's 3 GiB of a 16-bit save, grew into the room rank 0 kept,
        # and rank 0 gave its tier back reading after reading until it stopped the job with memory for both)
        largest_rise, = self._agree([-self.policy.expected_rise_bytes])
        self.policy.agreed_rise_bytes = -largest_rise
        failure: Optional[Exception] = None
        memory, decision, targets = None, HOLD, None
        try:
            if self.start_budget_bytes is None:
                self._start()
            # since the last forward pass (its backward) or update (before_update); at a step's end, the step too
            self._rise_boundary(ends_step=self._step_ended)
            if self._step_ended:  # this reading covered the end of the step: the step's rise is complete
                self.policy.observe_step_rise(self._step_rise)
                self._step_rise, self._step_ended = None, False
                self._note_slots_at_step_end()
            memory = self._read_memory()
            decision = self._decide(memory)
            if decision.action is Action.SHRINK:
                # the device tier's residents hold lent partitions: it is refitted (on every rank alike) first
                targets = self._param_cache_targets(decision.nbytes)
            elif decision.action is Action.GROW:
                self._take(decision.nbytes)
        except Exception as err:  # noqa: BLE001  (re-raised after the agreement)
            failure, decision = err, HOLD
        failure = self._refit_device_tier(targets, failed=failure is not None) or failure
        reason = None
        if failure is None:
            try:
                if decision.action is Action.SHRINK:
                    self._give_back(decision.nbytes)
                    self.meter.rebase()  # the step starts from the level after it
                if decision.action is not Action.HOLD:
                    level = logging.WARNING if decision.action is Action.SHRINK else logging.INFO
                    logger.log(level, "tencache: host memory %s (%s): %s; host cache budget now %s",
                               "pressure" if decision.action is Action.SHRINK else "back", _where(memory),
                               decision.reason, fmt_bytes(self.budget_bytes))
                    memory = self._read_memory()
                self.last_memory = memory
                if memory.available_bytes < self.policy.reserve_bytes(memory.total_bytes):
                    reason = self.policy.exhausted(memory.total_bytes, memory.allocatable_bytes,
                                                   self.reducible_bytes(), self.start_budget_bytes)
            except Exception as err:  # noqa: BLE001  (re-raised after the agreement)
                failure = err
        self.policy.reading_done()
        if self._agree([0 if reason is None and failure is None else -1])[0] < 0:  # some rank cannot go on
            if failure is not None:
                raise failure
            if reason is None:
                reason = "another rank cannot go on (its error has the reason)"
            where_in_step = WINDOW_UNKNOWN if micro_batches_done is None else BETWEEN_STEPS \
                if micro_batches_done == 0 else WITHIN_WINDOW.format(done=micro_batches_done, window=window)
            raise TencacheOutOfMemory(f"{reason} ({_where(memory)}). To go on: {REMEDY}; {where_in_step}")

    def _decide(self, memory: HostMemory):
        """The policy's decision on this reading, what this engine promised counted as taken; a growth only on what
        every engine of the process has not promised. Each rank of the node makes the same decision on the same
        memory (it takes its share), and the other ranks' engines promise alike: counted as this rank's times the
        ranks on the node, in a shrink as in a growth (until 2026-12-02 a shrink counted this rank's alone: at 2
        ranks it held where both ranks' next updates would fill more than the node had)."""
        decide = functools.partial(self.policy.decide, memory.total_bytes, reducible_bytes=self.reducible_bytes(),
                                   given_back_bytes=self.given_back_bytes, growable_bytes=self.growable_bytes(),
                                   optimizer_reducible_bytes=self._optimizer_reducible_bytes())
        # every rank of the node promises alike, and its updates fill on every rank: a shrink counts them all too
        decision = decide(memory.available_bytes, promised_bytes=self._promised_bytes() * self.policy.ranks)
        if decision.action is Action.GROW:
            with _LIVE_GOVERNORS_LOCK:
                governors = list(_LIVE_GOVERNORS)
            promised = sum(governor._promised_bytes() for governor in governors) * self.policy.ranks
            decision = decide(memory.available_bytes, promised_bytes=promised)
            if decision.action is not Action.GROW:
                decision = HOLD  # another engine's promise takes this free memory: no reason to give any back
        return decision

    def before_update(self) -> None:
        """Stage 3's step begins (its update, after the step's last backward): a boundary of the rise, so that the
        backward's peak is measured against the level around the backward, not against the higher level an update
        leaves (streaming slots brought back, a grown budget filled), which had halved the measured rise of a 1.3B
        model and let "auto" grow into memory the next backward needed (docs/reliability.md, memory pressure)."""
        self._rise_boundary()

    def end_optimizer_step(self) -> None:
        """An optimizer step ended (stage 3's _post_step). Its rise is the most over the boundaries from its second
        forward pass to the next step's first (before every forward pass, and where its update starts), which cover
        its last backward and its update: so the optimizer's first update, which creates its state once, falls in
        the first step measured (which the policy drops), whatever the gradient accumulation."""
        self._step_ended = True

    def close(self) -> None:
        with _LIVE_GOVERNORS_LOCK:
            _LIVE_GOVERNORS.discard(self)
        self.meter.close()

    # ------------------------------------------------------------------------------------------- private
    def _rise_boundary(self, ends_step: bool = False) -> None:
        """A boundary of the rise meter: the stretch since the last one counts in the current step's rise, and
        where ``ends_step`` (the first forward pass after an optimizer step) the whole step since the last such
        boundary too (memory/footprint.py: the span)."""
        rise = self.meter.boundary(ends_span=ends_step)
        self.rise_boundaries += 1
        if rise is not None:
            self._step_rise = max(self._step_rise or 0, rise)

    def _start(self) -> None:
        for swapper in self._param_swappers:
            swapper.plan()  # every partition size is known by the first forward pass
        self.start_budget_bytes = self.budget_bytes
        if self._optimizer is not None:
            self._optimizer_start = self._optimizer_target = self._optimizer.planned_host_footprint_bytes()
            if self.fills_free_memory and \
                    self._optimizer.budget.total_bytes < self._optimizer.state_bytes() and \
                    self._optimizer.footprint_keeping_everything_bytes() <= self._optimizer_start:
                # The streaming slots planned beside the budget would hold the rest of the state: keeping all of it
                # takes no more memory than streaming it, and no I/O.
                self._optimizer.resize_host_footprint(self._optimizer_start)

    def _give_back(self, nbytes: int) -> None:
        """Optimizer state first, then parameter cache slots (``give_back_split``); a cache that retires more or
        less than its share (whole slots) passes the difference on to the next. (A partition a shrinking cache gives
        up goes to its file unchanged: the masters owed to their files are filled from there, master_write_behind.py.)"""
        left = nbytes
        try:
            if self._optimizer is not None:
                footprint = self._optimizer_footprint()
                cut = give_back_split(left, self._optimizer_reducible_bytes(), ())[0]
                if cut > 0:
                    self._optimizer_target = footprint - cut
                    left -= cut  # (the target is lowered: counted given back even where the resize raises)
                    self._optimizer.resize_host_footprint(self._optimizer_target)
            for swapper in self._param_swappers:
                cut = min(left, swapper.store.reducible_cache_bytes)
                if cut <= 0:
                    continue
                cache = swapper.store.cache_bytes_reserved
                left -= cache - swapper.store.resize_cache(cache - cut)
        finally:
            # what was cut before a resize raised (a victim's write failed, Ctrl-C) stays counted: growing takes
            # it back (helper-184's review: it was never counted, so an explicit budget could not grow back)
            self.given_back_bytes += nbytes - left
            self.shrinks += 1
            self._footprint_changed()

    def _take(self, nbytes: int) -> None:
        """Parameter cache slots first (up to what was planned), then optimizer state: up to its start-up
        footprint, or, "auto", up to all of it."""
        wanted = min(nbytes, max(0, self.given_back_bytes) + self.growable_bytes())
        left = wanted
        for swapper in self._param_swappers:
            cache = swapper.store.cache_bytes_reserved
            grown = swapper.store.resize_cache(min(swapper.store.planned_cache_bytes, cache + left))
            left -= grown - cache
        if self._optimizer is not None and left > 0:
            ceiling = self._optimizer_start
            if self.fills_free_memory:
                ceiling = max(ceiling, self._optimizer.footprint_keeping_everything_bytes())
            # from what it takes now: streaming slots brought back beyond the least since the target was set (no
            # reads ahead, a slow drive) are in the footprint the resize subtracts, and a growth from the stale
            # target lowered the budget by the difference (helper-208)
            base = max(self._optimizer_target, self._optimizer_footprint())
            target = max(base, min(ceiling, base + left))
            left -= target - base
            self._optimizer_target = target
            self._optimizer.resize_host_footprint(target)
        self.given_back_bytes -= wanted - left  # negative once grown beyond the start-up budget
        self.grows += 1  # (holding more never streams more tensors at once: the slots' count stands)

    def _param_cache_targets(self, nbytes: int) -> dict:
        """The parameter cache size of each swapper once ``_give_back(nbytes)`` has run (``give_back_split``)."""
        _, cuts = give_back_split(nbytes, self._optimizer_reducible_bytes(),
                                  [swapper.store.reducible_cache_bytes for swapper in self._param_swappers])
        targets = {id(swapper): swapper.store.cache_bytes_reserved - cut
                   for swapper, cut in zip(self._param_swappers, cuts)}
        return targets

    def _refit_device_tier(self, cache_targets: Optional[dict] = None, failed: bool = False) -> Optional[Exception]:
        """Every rank proposes a device-tier budget from its own readings, and all apply the smallest (a collective:
        every rank calls this once per forward pass, tier or not, ``failed`` or not). ``cache_targets``: parameter
        cache sizes about to be set (a shrink), which bound the tier where it is carved from them. Returns the error
        this rank met (after the collective), or None."""
        coordinator = self._coordinator
        proposal = -1  # no tier here, or no reading (the minimum over ranks ignores it unless no rank has one)
        failure = None
        if coordinator is not None:  # the rise a tier made at the trace's completion keeps room for (helper-218)
            coordinator.step_rise_hint_bytes = self.policy.next_step_bytes
        try:
            if coordinator is not None and coordinator.tier is not None and not failed:
                swapper = coordinator.swapper
                cache = (cache_targets or {}).get(id(swapper))
                capacity = swapper.host_param_capacity(cache) if coordinator.gathers_alias_partitions else None
                proposal = coordinator.propose_device_budget(capacity,
                                                             step_rise_bytes=self.policy.next_step_bytes)
        except Exception as err:  # noqa: BLE001  (the caller re-raises it after the agreement)
            failure, proposal = err, -1
        agreed = self._agree([proposal if proposal >= 0 else _NO_PROPOSAL])[0]
        try:
            if proposal >= 0 and agreed != _NO_PROPOSAL:
                coordinator.apply_device_budget(agreed)
        except Exception as err:  # noqa: BLE001
            failure = err
        return failure


_NO_PROPOSAL = 1 << 62  # larger than any budget: a rank without a device tier does not lower the others'


def _where(memory: HostMemory) -> str:
    return "this node" if memory.bound_by == "node" else f"cgroup {memory.bound_by}"


def stage3_prior(stage3, accelerator_is_host: bool, bucket_unused: bool = False) -> RisePrior:
    """The step rise ``stage3`` (a built DeepSpeedZeroOptimizer_Stage3) is expected to have before one is measured
    (plan/memory_pressure.py ``stage3_rise_prior``), from its parameters, its gradient bucket and its sub-groups;
    ``bucket_unused``: each gradient is partitioned at once (one_rank_reduce.partitions_each_gradient_at_once)."""
    # DeepSpeed 0.19.8's names, read directly (contract.py pins the version): a renamed one fails here, loudly
    params = [param for group in stage3.fp16_groups for param in group]
    if not params:
        return NO_PRIOR
    gathered = sum(param.ds_numel for param in params)
    buffers = [bucket.buffer for bucket in stage3.ipg_buckets.values() if bucket.buffer is not None]
    # one bucket per communication dtype, keyed by it with or without contiguous_gradients' buffers: gradients fill
    # them together at most the gathered model's elements, and without buffers the reduce concatenates the gradients
    # cast to that dtype all the same (__avg_scatter_grads), as the step model prices it
    # (plan/workload.communication_bytes). Until 2026-11-30 a run without buffers took the parameters' element size
    gradient_bytes = max((dtype.itemsize for dtype in stage3.ipg_buckets), default=params[0].element_size())
    # a module around the bucket's reduce is taken as the largest parameter (the swapper sees no modules)
    largest_gathered = max(param.ds_numel * param.element_size() for param in params)
    largest_sub_group = max(stage3.fp16_partitioned_groups_flat_numel, default=0)
    return stage3_rise_prior(accelerator_is_host, gathered * gradient_bytes, stage3.reduce_bucket_size * gradient_bytes,
                             bool(buffers), largest_gathered, largest_sub_group * 4, bucket_unused)


def governor_of(optimizer) -> Optional[HostTierGovernor]:
    return getattr(optimizer, GOVERNOR_ATTRIBUTE, None)
