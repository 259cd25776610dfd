"""The step under tencache, with the budgets it would choose (docs/design.md; the same functions as at run time):
its plan, its replay and its memory. Pure.

- host tier "auto" = plan/budget.resolve_budgets on this machine's memory; parameter slots per size class
  (plan/size_classes.py), cache slots from the host tier first, the rest to optimizer state
  (plan/host_tier.split_host_budget, as the optimizer swapper does); the device tier (plan/device_tier.py) keeps
  gathered parameters by next use;
- at run time the governor (integrations/deepspeed/memory_pressure.py) grows an "auto" optimizer share into the
  memory the steps leave free, up to all of the state, and makes any budget give back what the step needs: the
  step is modelled at that steady state, decided by plan/memory_pressure.MemoryPressurePolicy on the memory this
  model predicts (``_governed_tier``);
- a gather served by the device tier moves nothing; a lend served by the host tier reads nothing; the reads left
  are issued ahead by plan/prefetch.PrefetchSchedule within the streaming slots; changed bytes of held tensors are
  written back only on eviction (none in steady state);
- optimizer state not held streams: the first sub-group's is read ahead during backward, and the next ones' into
  the streaming slots idle until the update, the next one's during each update, writes go behind (finishing during
  the next forward).
"""
import dataclasses
from collections import defaultdict
from typing import Dict, FrozenSet, List, Mapping, Optional, Set, Tuple

from ...config import AUTO
from ...profile.step_profile import StepProfile
from ...units import PAGE_BYTES, round_up
from ..budget import (AUTO_DEVICE_CACHE_FRACTION, DESCRIBED, UNLIMITED, MachineResources, parameter_lock_mode,
                      resolve_budgets)
from ..device_tier import device_tier_budget
from ..host_residency import steady_state
from ..host_tier import (OPTIMIZER_BYTES_PER_ELEMENT, OPTIMIZER_IO_BYTES_PER_HELD_BYTE, OPTIMIZER_STREAMING_SLOTS,
                         PARAM_IO_BYTES_PER_HELD_BYTE, TierDemand, split_host_budget, streaming_tensors_at_once)
from ..machine import Machine
from ..memory_pressure import Action, MemoryPressurePolicy, give_back_split
from ..prefetch import PrefetchSchedule
from ..size_classes import cache_slot_counts, class_bytes, merge_close_classes, size_histogram, streaming_slot_counts
from ..workload import Workload, ZeroSettings
from .costs import (allgather_s, backward_host_memory_s, deepspeed_pins, device_step_bytes, device_working_bytes,
                    gathered_bytes, heap_is_kept, heap_kept_bytes, host_resident_bytes, host_step_rise_bytes,
                    init_outside_pool_bytes, init_bytes_per_element_pooled, module_compute_s, nvme_space,
                    one_rank_on_a_host_accelerator, optimizer_cpu_s, optimizer_state_bytes_per_element, param_bytes,
                    persistent_keys, reduce_bucket_bytes, reduce_scatter_s, reduces_to_views, run_time_prior,
                    sub_group_file_bytes, partitions_gradients_at_once)
from .results import TENCACHE, Prediction, finish
from .timeline import OPTIMIZER, PARAMS, STEPS_REPLAYED, Pending, Rates, Timeline, channel_rates


@dataclasses.dataclass(frozen=True)
class TencachePlan:
    """The budgets tencache would choose for this workload on this machine, and what they hold in steady state.
    ``optimizer_share_bytes`` and ``param_cache_bytes`` are the steady state's, after the run-time governor
    (``_governed_tier``): an "auto" optimizer share grown, or either given back below the reserve;
    ``optimizer_start_share_bytes`` and ``param_cache_start_bytes`` were planned at start-up (``host_cache_bytes``
    split between the parameter cache slots and optimizer state). ``step_rise_bytes``: the step's host rise the
    governor was modelled with."""

    host_cache_bytes: int
    param_streaming_bytes: int
    param_cache_bytes: int
    optimizer_share_bytes: int
    device_tier_bytes: int
    params_all_held: bool
    optimizer_held: frozenset
    optimizer_streaming_bytes: int
    optimizer_start_share_bytes: int
    step_rise_bytes: int = 0
    param_slots_locked: bool = True  # plan/budget.parameter_lock_mode: not on a host accelerator by default
    optimizer_prefixes: Mapping[str, int] = dataclasses.field(default_factory=dict)  # bytes held of streaming ones
    param_cache_start_bytes: int = 0
    optimizer_start_footprint_bytes: int = 0  # the optimizer tier's memory before the governor's first decision
    masters_in_partitions: bool = False  # each update fills its masters from the held partitions (no read)
    masters_owed: bool = False  # an updated master is owed to its file, not written (read from its partitions)

    def optimizer_io_bytes(self, name: str, nbytes: int) -> int:
        """What a read or write of optimizer tensor ``name`` (``nbytes``) moves: less the prefix the tier holds."""
        return nbytes - self.optimizer_prefixes.get(name, 0)


def described_resources(workload: Workload, machine: Machine) -> MachineResources:
    """What a rank of ``workload`` finds on the described ``machine``, as MachineResources.probe reads a real one:
    the budgets resolve from it, and the run's own checks of an explicit budget (config_checks) take it."""
    return MachineResources(host_total_bytes=machine.host_memory_bytes,
                            host_available_bytes=machine.available_host_bytes,
                            memlock_limit_bytes=UNLIMITED,
                            device_free_bytes=0 if machine.accelerator_is_host else
                            max(0, machine.accelerator_memory_bytes
                                - device_working_bytes(workload, machine.accelerator_is_host)),
                            local_world_size=machine.ranks_per_node, host_bound_by=DESCRIBED + machine.name)


def tencache_plan(workload: Workload, machine: Machine) -> TencachePlan:
    """The budgets, by the same functions the swappers call at run time."""
    zero = workload.zero
    config = zero.tencache
    swapped = {key: param_bytes(workload, key) for key, p in workload.partitions.items() if p.on_nvme}
    histogram = merge_close_classes(size_histogram(swapped.values()))
    streaming = class_bytes(streaming_slot_counts(histogram, max(1, zero.param_buffer_count))) if swapped else 0
    resources = described_resources(workload, machine)
    slots_locked = parameter_lock_mode(config.pin_memory, machine.accelerator_is_host) != "off"
    budgets = resolve_budgets(config, resources, stream_min_bytes=streaming, locks_memory=slots_locked)
    host = budgets.host_cache_bytes
    streaming_counts = streaming_slot_counts(histogram, max(1, zero.param_buffer_count))
    cache_counts = cache_slot_counts(histogram, streaming_counts, host) if swapped else {}
    param_cache = class_bytes(cache_counts)
    all_swapped = sum(size for size in swapped.values())
    demands = [TierDemand("params", param_cache, PARAM_IO_BYTES_PER_HELD_BYTE)]
    if zero.offload_optimizer == "nvme":
        demands.append(TierDemand("optimizer", max(workload.rank_elements * OPTIMIZER_BYTES_PER_ELEMENT, host),
                                  OPTIMIZER_IO_BYTES_PER_HELD_BYTE))
    shares = split_host_budget(host, demands)
    start_share, start_cache = shares.get("optimizer", 0), param_cache
    # the parameter cache can give memory back where its slots can be retired: not where CUDA registered them
    # (memory/pool.py can_retire). The run registers locked slots wherever torch sees CUDA, so a host
    # accelerator with "pin_memory": "required" on a CUDA machine keeps them too: the model is optimistic there.
    cache_reducible = not (slots_locked and not machine.accelerator_is_host)
    governed = _governed_tier(workload, machine, budgets.host_source == AUTO, start_share, streaming, param_cache,
                              cache_reducible)
    optimizer_share, rise = governed.optimizer_share_bytes, governed.step_rise_bytes
    if governed.param_cache_bytes < param_cache:  # given back at run time: the cache slots that stay
        param_cache = class_bytes(cache_slot_counts(histogram, streaming_counts, governed.param_cache_bytes))
    # every partition stays in host memory from use to use: slots for all of them, and a host tier at all, or
    # gathers that are the partitions themselves (one rank on a host accelerator: the optimizer step updates them in
    # place, kept gathered). Otherwise the slots keep nothing once a use is over: gpt2-tiny fp32 at 2 ranks with
    # host_cache_bytes 0 read every partition once a step (its device tier keeping the backward's gathers), where
    # at one rank bf16 it read none.
    params_all_held = bool(swapped) and (host > 0 or gathers_alias_partitions(workload, machine)) and \
        streaming + param_cache >= class_bytes(histogram)
    param_capacity = all_swapped if params_all_held else param_cache
    # as the coordinator proposes it (integrations/deepspeed/coordinator.py, propose_device_budget): on a host
    # accelerator at several ranks the all-gather's output is host memory of its own, the rank's share of what the
    # node has available between steps, less a step's rise
    aliasing = gathers_alias_partitions(workload, machine)
    device_free, device_rise = resources.device_free_bytes, 0
    if machine.accelerator_is_host and not aliasing:
        device_free = governed.available_bytes // max(1, machine.ranks_per_node)
        device_rise = rise
    # the tier keeps what tencache's parameter swapper gathers: none where the parameters are not on NVMe (the run
    # builds no tier then: coordinator.py; a tier of 35 GiB was predicted, and its hits, with offload_param "cpu")
    device = device_tier_budget(config.device_cache_bytes, aliasing, param_capacity, device_free,
                                AUTO_DEVICE_CACHE_FRACTION, step_peak_rise_bytes=device_rise) \
        if config.device_cache_bytes != 0 and zero.offload_param == "nvme" else 0
    # integrations/deepspeed/master_write_behind.py: with the update's writes behind it, a master its partitions
    # hold (in host memory or on their own files) is owed to its file from the update that changed both, never
    # written in a step; the next update fills it from the partitions: copied where they are in host memory, else
    # read from the partitions' files (the same bytes as the master's own file)
    masters_owed = zero.offload_optimizer == "nvme" and zero.tencache_writes_behind and bool(swapped) and \
        zero.element_bytes == zero.precision.master_bytes
    # integrations/deepspeed/master_copies.py: partitions in the masters' dtype, swapped by tencache, all in host
    # memory at the update: kept by a host tier (any master, owed or not), or, without one, lent as the gathers a
    # device tier keeps where they are the partitions (one rank on a host accelerator), which only an owed master's
    # fill copies from (gpt2-tiny with host_cache_bytes 0 and the device tier "auto", 2026-12-06: every master
    # copied from its partitions, none read). Without either the slots keep nothing after the update writes them.
    masters_in_partitions = zero.offload_optimizer == "nvme" and params_all_held and \
        zero.element_bytes == zero.precision.master_bytes and \
        (host > 0 or (masters_owed and aliasing and device >= all_swapped))
    held = frozenset()
    prefixes: Dict[str, int] = {}
    optimizer_streaming = 0
    if zero.offload_optimizer == "nvme":
        keys, sizes = _optimizer_sequence(workload)
        # the masters the partitions hold yield the tier's room to the moments (plan/eviction.CopiesElsewhere)
        filled = frozenset(f"p{i}" for i in range(len(workload.sub_groups))
                           if (masters_in_partitions or masters_owed) and _partitions_on_nvme(workload, i))
        residency = steady_state(keys, sizes, optimizer_share, prefixes=True, elsewhere=filled)
        held, prefixes = residency.held, dict(residency.prefixes)
        if len(held) < len(sizes):  # a sub-group's tensors stream through slots (_optimizer_streaming_bytes)
            optimizer_streaming = _optimizer_streaming_bytes(workload)
        else:  # the gradient an update fills from stage 3's buffer still takes one
            optimizer_streaming = _update_slot_bytes(workload)
    return TencachePlan(host, streaming, param_cache, optimizer_share, device, params_all_held, held,
                        optimizer_streaming, start_share, rise, slots_locked, prefixes, start_cache,
                        governed.start_footprint_bytes, masters_in_partitions, masters_owed)


@dataclasses.dataclass(frozen=True)
class _GovernedTier:
    """What ``_governed_tier`` decided, and the optimizer tier's footprint it started from."""

    optimizer_share_bytes: int
    param_cache_bytes: int
    step_rise_bytes: int
    start_footprint_bytes: int
    available_bytes: int = 0  # the node's host memory available between steps once the governor decided


def _governed_tier(workload: Workload, machine: Machine, grows: bool, start_share: int, param_streaming: int,
                   param_cache: int, cache_reducible: bool = True) -> _GovernedTier:
    """The host tier in steady state under the run-time governor: the optimizer share and the parameter cache it
    keeps, and the step rise it was decided by.

    At run time the governor (integrations/deepspeed/memory_pressure.py) reads the node's available memory before
    each forward pass and lets plan/memory_pressure.MemoryPressurePolicy decide: at the first reading, before any
    step, on the run's prior (``costs.run_time_prior``: a reduce of the gradient bucket, no activations, and the
    bucket the first backward fills), a give-back up to the reserve; then on the measured rise (this model's),
    growth too. The same policy decides here, twice in that order, on the available memory this model predicts
    between steps: the machine's, less each rank's ``_held_between_steps`` and start-up optimizer footprint. Each
    lands in its band, so later readings hold.

    - Below the reserve, any budget gives back: optimizer state first (down to its streaming slots), then
      parameter cache slots where they can be retired (``cache_reducible``: not CUDA-registered ones), as
      ``HostTierGovernor._give_back`` does. The slots that stay are planned anew for the smaller cache
      (``cache_slot_counts``), where the run retires whole slots of the sizes it has: the same bytes, within a
      slot, and maybe another mix of sizes. The run gives back at its first reading, before any step, with the
      rise assumed (plan/memory_pressure.py ``RisePrior``); initialisation holds the start-up split:
      ``_tencache_memory`` counts both.
    - With available at least 1.5 x its reserve, an "auto" budget takes the excess over 1.25 x the reserve (each
      rank its share), up to all of the optimizer state (the store's page-rounded buffers); the footprint it grows
      is the kept state plus the streaming slots, which go once everything is kept. Parameter cache slots do not
      grow (the governor takes back only what it gave)."""
    ranks = max(1, machine.ranks_per_node)
    rise = host_step_rise_bytes(workload, machine)
    footprint = least = state = update_slot = 0
    if workload.zero.offload_optimizer == "nvme":
        sizes = _optimizer_sequence(workload)[1]
        state = sum(round_up(size, PAGE_BYTES) for size in sizes.values())
        update_slot, least = _update_slot_bytes(workload), _optimizer_streaming_bytes(workload)
        if start_share >= state or (grows and start_share + least >= state + update_slot):
            # all of it kept (the governor keeps it all at its first reading): the update's slot beside it
            start_share, footprint = max(start_share, state), state + update_slot
        else:
            footprint = start_share + least
    available = machine.available_host_bytes - ranks * (
        _held_between_steps(workload, machine, param_streaming + param_cache) + footprint)
    start_footprint, planned_cache = footprint, param_cache
    given = 0
    # the first reading, before any step, on the run's prior; then the readings on the measured rise, from where
    # that left the tier. The run's first reading sees the gradient bucket untouched and its prior counts it: where
    # stage 3 reduces itself the same as this available memory, which has it resident, against a prior without it;
    # where tencache partitions each gradient at once this available memory leaves it out (it is never written),
    # and the prior keeps it, as the run's does
    prior = run_time_prior(workload, machine.accelerator_is_host)
    views = reduces_to_views(workload, machine)
    first = MemoryPressurePolicy(ranks, prior if partitions_gradients_at_once(workload, machine)
                                 else dataclasses.replace(prior, untouched_bytes=0))
    measured = MemoryPressurePolicy(ranks)
    measured.observe_step_rise(rise)  # the first measured step creates the optimizer's state: the policy drops it
    measured.observe_step_rise(rise)
    # no backward has run at the first reading: the heap it keeps (in ``_held_between_steps``) is not there yet
    not_yet_kept = ranks * heap_kept_bytes(workload, machine, reduce_views=views)
    for policy, unseen in ((first, not_yet_kept), (measured, 0)):
        cache_given = param_cache if cache_reducible else 0
        decision = policy.decide(machine.host_memory_bytes, available + unseen,
                                 reducible_bytes=max(0, footprint - least) + cache_given, given_back_bytes=given,
                                 growable_bytes=max(0, state + update_slot - footprint) if grows and state else 0,
                                 optimizer_reducible_bytes=max(0, footprint - least))
        if decision.action is Action.SHRINK:
            cut, (cache_cut,) = give_back_split(decision.nbytes, max(0, footprint - least), [cache_given])
            footprint, param_cache = footprint - cut, param_cache - cache_cut
            start_share = max(0, footprint - least) if footprint else 0
        elif decision.action is Action.GROW:  # as HostTierGovernor._take: cache slots it gave first
            cache_back = min(decision.nbytes, planned_cache - param_cache)
            param_cache += cache_back
            ceiling = max(start_footprint, state + update_slot) if grows else start_footprint
            footprint = min(ceiling, footprint + decision.nbytes - cache_back)
            # as OptimizerStore.resize_host_footprint: all of it kept once it holds the state and the update's
            # slot, else less the slots
            start_share = state if footprint >= state + update_slot else max(start_share, footprint - least)
        nbytes = decision.nbytes if decision.action is not Action.HOLD else 0
        given += -nbytes if decision.action is Action.GROW else nbytes
        available += ranks * (nbytes if decision.action is Action.SHRINK else -nbytes)
    return _GovernedTier(start_share, param_cache, rise, start_footprint, max(0, available))


def gathers_alias_partitions(workload: Workload, machine: Machine) -> bool:
    """A gathered parameter is a view of its partition (DeepSpeed's CPU accelerator at one rank, as the coordinator's
    ``gathers_alias_partitions``): a gather moves nothing, the device tier is carved out of the host tier, and what it
    keeps stays gathered across the optimizer step, which updates it in place. Elsewhere the tier is emptied at
    every optimizer step (its copies go stale)."""
    return one_rank_on_a_host_accelerator(workload, machine)


def _device_tier_held_bytes(workload: Workload, plan: TencachePlan) -> int:
    """The most the device tier holds within a step: its budget, or every parameter a step gathers where that is
    less (gpt2-small fp32 at 2 ranks: the whole model, 0.46 GiB, under a budget of 4.8 GiB). It fills from empty
    in each step. Where a gathered parameter is memory of its own on the host (a host accelerator at several
    ranks) this is host memory at the step's peak. (The governor's rise in ``_governed_tier`` does not count it:
    the budget is sized from what the governor leaves.)"""
    gathered = sum(gathered_bytes(workload, key) for key in {key for _index, key in workload.read_fetches()})
    return min(plan.device_tier_bytes, gathered)


def _optimizer_streaming_bytes(workload: Workload) -> int:
    """The slots optimizer state that is not kept streams through (OptimizerStore.least_host_footprint_bytes): a
    sub-group's four tensors, and with more than one sub-group the next one's read ahead and the last one's written
    behind (unless the config turns ``pipeline_read`` or ``pipeline_write`` off explicitly, as the swapper's
    ``_reads_two_sub_groups`` and ``_writes_while_stepping``), at most the slots there are
    (``offload_optimizer.buffer_count``, at least 8)."""
    zero = workload.zero
    largest = zero.swap_nbytes(workload.largest_sub_group_elements, zero.precision.master_bytes)
    several = len(workload.sub_groups) > 1
    slots = max(OPTIMIZER_STREAMING_SLOTS, zero.optimizer_buffer_count)
    return largest * min(streaming_tensors_at_once(reads_ahead=several and zero.tencache_reads_ahead,
                                                   writes_behind=several and zero.tencache_writes_behind), slots)


def _update_slot_bytes(workload: Workload) -> int:
    """The streaming slot an update lends even when every sub-group is kept: the gradient it fills from stage 3's
    buffer (OptimizerStore.resize_host_footprint's ``update_slots``)."""
    return workload.zero.swap_nbytes(workload.largest_sub_group_elements, workload.zero.precision.master_bytes)


def _held_between_steps(workload: Workload, machine: Machine, param_slot_bytes: int) -> int:
    """Host bytes a rank holds between two steps besides its optimizer footprint: what ``_tencache_memory`` counts
    less the optimizer's, less a step's own working set on a host accelerator (freed by the time memory is read)
    and the optimizer's one-off initialisation. The heap a backward keeps (``heap_kept_bytes``) among it: from the
    first step on (``_governed_tier``'s first reading, before any backward, leaves it out)."""
    common = host_resident_bytes(workload, machine, reduce_views=reduces_to_views(workload, machine),
                                 bucket_unused=partitions_gradients_at_once(workload, machine))
    step = device_step_bytes(workload, host_accelerator=True) if machine.accelerator_is_host else 0
    on_host = common["device_on_host"] - step
    return (common["baseline"] + common["heap"] + common["gradients"] + on_host + param_slot_bytes
            + _params_off_nvme_bytes(workload))


def _params_off_nvme_bytes(workload: Workload) -> int:
    """Parameter partitions kept in pinned host memory rather than on NVMe (offload to cpu, or ``max_in_cpu``)."""
    return workload.params_in_host_memory_elements * workload.zero.element_bytes


# The replay's keys for a sub-group's tensors in the optimizer store ("p3": sub-group 3's master), by file
_OPTIMIZER_KEYS = {"p": "master", "m": "exp_avg", "v": "exp_avg_sq"}


def _sub_group_keys(zero: ZeroSettings, i: int) -> List[str]:
    """Sub-group ``i``'s tensors in the store: its master and the optimizer's state tensors (Adam's two moments,
    Adagrad's one)."""
    return [f"{key}{i}" for key, name in _OPTIMIZER_KEYS.items()
            if name == "master" or name in zero.precision.state_names]


def _optimizer_sequence(workload: Workload) -> Tuple[List[str], Dict[str, int]]:
    """The optimizer store's accesses in a step: per sub-group its master and state tensors (Adam's two moments,
    Adagrad's one) in the update. The gradients are not the store's: the update reads them from stage 3's
    own partition buffer, in any dtype and on any accelerator (integrations/deepspeed/stage3_gradients.py)."""
    zero, keys, sizes = workload.zero, [], {}
    for i in range(len(workload.sub_groups)):
        files = sub_group_file_bytes(zero, workload.sub_group_elements(i))
        for key in _sub_group_keys(zero, i):
            sizes[key] = files[_OPTIMIZER_KEYS[key[0]]]
            keys.append(key)
    return keys, sizes


def predict_tencache(workload: Workload, machine: Machine) -> Prediction:
    zero, elem = workload.zero, workload.zero.element_bytes
    plan = tencache_plan(workload, machine)
    rates = channel_rates(machine, arena_buffers=True)
    gathers = workload.read_fetches()
    micro_steps = _micro_step_gathers(workload, machine, plan, rates, gathers)
    written_params = {key for micro in micro_steps for position, (_index, key) in enumerate(micro.lends)
                      if position in micro.misses}
    timeline = rates.timeline()
    h2d = not machine.accelerator_is_host
    opt_keys, opt_sizes = _optimizer_sequence(workload)
    streams = zero.offload_optimizer == "nvme"
    first_backward = next((i for i, f in enumerate(workload.fetches) if f.phase != "forward"), 0)
    read_in_update: Dict[int, Pending] = {}  # the first micro-step's reads started during the update before it
    for _step in range(STEPS_REPLAYED):
        start = timeline.now
        moved_before = dict(timeline.moved)
        parts_before = dict(timeline.parts)
        busy_before = dict(timeline.busy)
        ahead: Dict[str, Pending] = {}
        for micro in range(workload.gas):
            issued: Dict[int, Pending] = read_in_update if micro == 0 else {}
            gathering = micro_steps[micro]
            lend_keys, host_misses, schedule = gathering.lend_keys, gathering.misses, gathering.schedule
            lend_at, gather_at = gathering.lend_at, gathering.gather_at
            for index, fetch in enumerate(workload.fetches):
                if streams and micro == workload.gas - 1 and index == first_backward:
                    for name in _backward_reads_ahead(workload, plan):
                        ahead[name] = timeline.issue("nvme_read", plan.optimizer_io_bytes(name, opt_sizes[name]), name,
                                                     store=OPTIMIZER)
                for position in lend_at.get(index, []):
                    if position in host_misses:
                        done = issued.pop(position, None)
                        if done is None:
                            done = timeline.issue("nvme_read", param_bytes(workload, lend_keys[position]),
                                                  lend_keys[position], store=PARAMS)
                        timeline.wait(done, "nvme_read")
                    for target in (schedule.to_issue(position) if schedule else ()):
                        if target > position and target not in issued:
                            issued[target] = timeline.issue("nvme_read", param_bytes(workload, lend_keys[target]),
                                                            lend_keys[target], store=PARAMS)
                if h2d and zero.offload_param != "none" and gather_at.get(index):  # (none: partitions on the device)
                    timeline.wait(timeline.issue("h2d", sum(workload.partitions[k].part_numel * elem
                                                            for k in gather_at[index])), "h2d")
                # a gathered parameter the device tier keeps is not gathered again
                timeline.work(allgather_s(workload, machine, gather_at.get(index, [])), "collective")
                timeline.work(module_compute_s(fetch, rates), "compute")
            timeline.work(backward_host_memory_s(workload, machine, micro, reduces_to_views(workload, machine),
                                                 norms_reuse_memory=True), "compute")
            timeline.work(reduce_scatter_s(workload, machine), "collective")
            if h2d and zero.offload_optimizer != "none":
                timeline.wait(timeline.issue("h2d", workload.rank_elements * elem), "h2d")
        tail_reads = _tail_reads(workload, micro_steps[0])
        read_in_update = {}
        if streams:
            _tencache_optimizer(workload, timeline, rates, plan, opt_sizes, ahead, written_params,
                                tail_reads, read_in_update)
        else:  # stage 3 writes each sub-group's partitions after its Adam (on the host, or the device's, not priced)
            for i in range(len(workload.sub_groups)):
                if zero.offload_optimizer == "cpu":
                    timeline.work(optimizer_cpu_s(workload, workload.sub_group_elements(i), rates), "cpu_adam")
                _write_back_partitions(workload, timeline, i, written_params, tail_reads, read_in_update)
        for position, key in tail_reads.items():  # those of no sub-group the replay walks: at the update's end
            if position not in read_in_update:
                read_in_update[position] = timeline.issue("nvme_read", param_bytes(workload, key), key, store=PARAMS)
        timeline.work(allgather_s(workload, machine, persistent_keys(workload)), "collective")
        step_s = timeline.now - start
    moved = {k: v - moved_before.get(k, 0) for k, v in timeline.moved.items()}
    parts = {k: v - parts_before.get(k, 0.0) for k, v in timeline.parts.items()}
    step_s = timeline.steady_step(step_s, parts, busy_before)
    gathered = sum(len(micro.gather_keys) for micro in micro_steps)
    device_rate = 1.0 - gathered / (len(gathers) * workload.gas) if gathers else None
    lent = sum(len(micro.lends) for micro in micro_steps)
    host_rate = 1.0 - sum(len(micro.misses) for micro in micro_steps) / lent if lent else None
    memory = _tencache_memory(workload, machine, plan)
    failures = []
    if zero.offload_optimizer == "nvme" and zero.precision.mixed:
        client = "" if zero.precision.from_config else " (a client optimizer: taken as DeepSpeedCPUAdam's default)"
        failures.append(f"tencache refuses it at deepspeed.initialize: with {zero.precision.master_key} the "
                        f"optimizer keeps its state in fp32{client}, and tencache's optimizer tier stores a sub-group "
                        f"in one dtype; {zero.precision.remedy}")
    budgets = {"host_cache_bytes": plan.host_cache_bytes, "param_streaming_bytes": plan.param_streaming_bytes,
               "param_cache_bytes": plan.param_cache_bytes, "optimizer_share_bytes": plan.optimizer_share_bytes,
               "optimizer_start_share_bytes": plan.optimizer_start_share_bytes,
               "param_cache_start_bytes": plan.param_cache_start_bytes,
               "step_rise_bytes": plan.step_rise_bytes, "device_cache_bytes": plan.device_tier_bytes}
    return finish(TENCACHE, step_s, parts, moved, memory, device_rate, host_rate, failures, budgets)


@dataclasses.dataclass(frozen=True)
class _MicroStepGathers:
    """One micro-step's gathers as the tiers serve them: what the device tier does not keep is gathered
    (``gather_at``: fetch index -> keys), a swapped one lent by the parameter tier (``lends``: (fetch index, key) in
    order; ``misses``: positions in it read from NVMe, ``schedule`` when each read is issued)."""

    gather_at: Dict[int, List[str]]
    lends: List[Tuple[int, str]]
    misses: FrozenSet[int]
    schedule: Optional[PrefetchSchedule]

    @property
    def lend_keys(self) -> List[str]:
        return [key for _index, key in self.lends]

    @property
    def lend_at(self) -> Dict[int, List[int]]:
        at: Dict[int, List[int]] = defaultdict(list)
        for position, (index, _key) in enumerate(self.lends):
            at[index].append(position)
        return at

    @property
    def gather_keys(self) -> List[str]:
        return [key for keys in self.gather_at.values() for key in keys]


def _micro_step_gathers(workload: Workload, machine: Machine, plan: TencachePlan, rates: Rates,
                        gathers: List[Tuple[int, str]]) -> List[_MicroStepGathers]:
    """Each micro-step's gathers (``workload.read_fetches()``: ZeRO-3's retention applied), in the step's order.
    The device tier keeps gathered parameters between uses, chosen by next use; where its copies go stale at the
    optimizer step (``gathers_alias_partitions`` false) it starts each step empty, so the step's first micro-step
    gathers more than the ones after it (gradient accumulation). The parameter tier sees the lends of the whole
    step in order."""
    gas = workload.gas
    keys = [key for _index, key in gathers]
    sizes = {key: gathered_bytes(workload, key) for key in keys}
    kept = frozenset(steady_state(keys, sizes, plan.device_tier_bytes).misses) if gathers else frozenset()
    if gathers and not gathers_alias_partitions(workload, machine):
        first = frozenset(steady_state(keys, sizes, plan.device_tier_bytes, emptied_each_pass=True).misses)
    else:
        first = kept
    device_misses = [first] + [kept] * (gas - 1)
    lends = [[gathers[position] for position in sorted(misses) if workload.partitions[gathers[position][1]].on_nvme]
             for misses in device_misses]
    lend_sizes = {key: param_bytes(workload, key) for micro in lends for _index, key in micro}
    if plan.params_all_held or not lend_sizes:
        host_misses = [frozenset()] * gas
    elif first == kept:  # every micro-step lends the same sequence: its own steady state
        one = frozenset(steady_state([key for _index, key in lends[0]], lend_sizes, plan.param_cache_bytes).misses)
        host_misses = [one] * gas
    else:  # the step's sequence, split back into its micro-steps
        step_misses = steady_state([key for micro in lends for _index, key in micro], lend_sizes,
                                   plan.param_cache_bytes).misses
        host_misses, offset = [], 0
        for micro in lends:
            host_misses.append(frozenset(p - offset for p in step_misses if offset <= p < offset + len(micro)))
            offset += len(micro)
    out, schedules = [], {}
    for misses, micro_lends, micro_host in zip(device_misses, lends, host_misses):
        at: Dict[int, List[str]] = defaultdict(list)
        for position in sorted(misses):
            index, key = gathers[position]
            at[index].append(key)
        memo = (tuple(micro_lends), micro_host)
        if memo not in schedules:
            schedules[memo] = _param_schedule(workload, micro_lends, set(micro_host), rates,
                                              plan.param_streaming_bytes)
        out.append(_MicroStepGathers(dict(at), micro_lends, micro_host, schedules[memo]))
    return out


def _param_schedule(workload: Workload, lends, misses: Set[int], rates: Rates,
                    in_flight_bytes: int) -> Optional[PrefetchSchedule]:
    """plan/prefetch.py's schedule over the lends of one micro-step, with the compute between them: reads issued
    within it, as the parameter swapper issues them (within its step: under gradient accumulation the run's reads
    may start in the micro-step before, which makes the model pessimistic there)."""
    if not misses:
        return None
    elapsed = 0.0
    lend_index = 0
    offsets = []
    for index, fetch in enumerate(workload.fetches):
        while lend_index < len(lends) and lends[lend_index][0] == index:
            offsets.append(elapsed)
            lend_index += 1
        elapsed += module_compute_s(fetch, rates)
    keys = [key for _index, key in lends]
    profile = StepProfile(tuple(keys), tuple(param_bytes(workload, key) for key in keys), tuple(offsets),
                          (None,) * len(keys), (0.0,) * (len(keys) + 1), elapsed)
    missed = [param_bytes(workload, keys[position]) for position in misses]
    read_rate = rates.channels["nvme_read"] * rates.nvme_request_factor("read", sum(missed) // max(1, len(missed)))
    return PrefetchSchedule.from_profile(profile, read_rate, max(1, in_flight_bytes), reads_at=misses,
                                         within_step=True)


def _tail_reads(workload: Workload, first: "_MicroStepGathers") -> Dict[int, str]:
    """{position: partition} of the next step's first parameter reads that its schedule cannot start in time within
    it (``PrefetchSchedule.tail_reads``), as many as the parameter swapper starts during the update before: the
    first ``buffer_count`` - 1, soonest needed first (param_swapper.py ``_read_ahead_for_next_step``; nothing else is
    lent then). The replay issues each right after its sub-group's writes (the run: once they are done), and those
    of no sub-group it walks at the update's end."""
    if first.schedule is None:
        return {}
    reads = [position for position in first.schedule.tail_reads if position in first.misses]
    return {position: first.lend_keys[position] for position in reads[:max(0, workload.zero.param_buffer_count - 1)]}


def _backward_reads_ahead(workload: Workload, plan: TencachePlan) -> List[str]:
    """The optimizer tensors a backward reads ahead (cache/optimizer_reads_ahead.py
    ``during_backward``): the first sub-group's that are not held, then the next sub-groups' in the update's order,
    as many as the streaming slots hold besides those and the slot the update lends the first sub-group's gradient
    (the model's gradients come from stage 3's buffer: none on file). The replay issues them where the step's last
    backward starts; the run starts the first sub-group's in the first one, so under gradient accumulation the model
    is pessimistic. None with ``pipeline_read`` off explicitly."""
    if not workload.zero.tencache_reads_ahead:
        return []
    first = _read_keys(workload, plan, 0)
    later = [name for i in range(1, len(workload.sub_groups)) for name in _read_keys(workload, plan, i)]
    idle = plan.optimizer_streaming_bytes // _update_slot_bytes(workload) - len(first) - 1
    return first + later[:max(0, idle)]


def _read_keys(workload: Workload, plan: TencachePlan, i: int) -> List[str]:
    """Sub-group ``i``'s tensors its update reads from file: those the tier does not hold, but a master the
    parameter partitions hold (``_filled_master``)."""
    return [name for name in _sub_group_keys(workload.zero, i) if name not in plan.optimizer_held
            and not _filled_master(workload, plan, i, name)]


def _filled_master(workload: Workload, plan: TencachePlan, i: int, name: str) -> bool:
    """Is ``name`` sub-group ``i``'s master, which its update fills from the held parameter partitions
    (``masters_in_partitions``; ``_master_of_partitions``: a partition too small to swap beside swapped ones is
    resident, and filled from)."""
    return plan.masters_in_partitions and _master_of_partitions(workload, plan, i, name)


def _owed_master(workload: Workload, plan: TencachePlan, i: int, name: str) -> bool:
    """Is ``name`` sub-group ``i``'s master, owed to its file by each update and so never written in a step
    (``masters_owed``)? Where the partitions are not held, the update reads it from their files instead."""
    return plan.masters_owed and _master_of_partitions(workload, plan, i, name)


def _master_of_partitions(workload: Workload, plan: TencachePlan, i: int, name: str) -> bool:
    """Is ``name`` sub-group ``i``'s master, of which its parameter partitions are a copy the store takes? Not where
    the tier holds it, nor a prefix of it (the store reads and writes those itself), nor where none of its
    partitions is on NVMe (``max_in_cpu``: stage 3 keeps such a sub-group in its own flat buffer)."""
    return _OPTIMIZER_KEYS[name[0]] == "master" and name not in plan.optimizer_held and \
        name not in plan.optimizer_prefixes and _partitions_on_nvme(workload, i)


def _partitions_on_nvme(workload: Workload, i: int) -> bool:
    """Has sub-group ``i`` a parameter partition on NVMe (else stage 3 keeps it in its own flat buffer)?"""
    return any(workload.partitions[key].on_nvme for key in workload.sub_groups[i])


def _tencache_optimizer(workload: Workload, timeline: Timeline, rates: Rates, plan: TencachePlan,
                        sizes: Dict[str, int], ahead: Dict[str, Pending], written_params: Set[str],
                        tail_reads: Mapping[int, str], read_in_update: Dict[int, Pending]) -> None:
    """The update, sub-group by sub-group; each of ``tail_reads`` is issued into ``read_in_update`` once its
    sub-group's partitions are written."""
    groups = len(workload.sub_groups)

    def read(i: int) -> None:
        for name in _read_keys(workload, plan, i):
            if name not in ahead:
                ahead[name] = timeline.issue("nvme_read", plan.optimizer_io_bytes(name, sizes[name]), name,
                                             store=OPTIMIZER)

    for i in range(groups):
        read(i)
        for name in _sub_group_keys(workload.zero, i):
            if name in ahead:
                timeline.wait(ahead.pop(name), "nvme_read")
            elif _filled_master(workload, plan, i, name):  # copied from the partitions on the training thread
                timeline.work(sizes[name] / rates.host_copy_bytes_per_s, "compute")
        if i + 1 < groups and workload.zero.tencache_reads_ahead:  # the next sub-group's, while this one steps
            read(i + 1)
        timeline.work(optimizer_cpu_s(workload, workload.sub_group_elements(i), rates), "cpu_adam")
        # written behind, in stage 3's order (the sub-group's fp16 partitions, then its optimizer state); the next
        # step's reads of the same tensors wait for them
        _write_back_partitions(workload, timeline, i, written_params, tail_reads, read_in_update)
        for name in _sub_group_keys(workload.zero, i):
            if not workload.zero.tencache_writes_behind:
                # pipeline_write off: the update flushes each of the sub-group's tensors, held or not, the whole
                # tensor, and waits (OptimizerSwapper.swap_out_optimizer_state: store.flush_key)
                timeline.wait(timeline.issue("nvme_write", sizes[name], name, store=OPTIMIZER), "nvme_write")
                continue
            # a master its partitions hold is owed to its file, which nothing reads in a step: not written
            # (integrations/deepspeed/master_write_behind.py)
            owed = _owed_master(workload, plan, i, name)
            if name not in plan.optimizer_held and not owed:
                timeline.issue("nvme_write", plan.optimizer_io_bytes(name, sizes[name]), name, store=OPTIMIZER)


def _write_back_partitions(workload: Workload, timeline: Timeline, i: int, written_params: Set[str],
                           tail_reads: Mapping[int, str], read_in_update: Dict[int, Pending]) -> None:
    """Sub-group ``i``'s updated partitions, written behind where the tier does not hold them (the next step's
    reads of the same tensors wait for them); then those of ``tail_reads`` it rewrote are read back for the next
    step (param_swapper.py ``_read_ahead_for_next_step``)."""
    for key in workload.sub_groups[i]:
        if key in written_params:
            timeline.issue("nvme_write", param_bytes(workload, key), key, store=PARAMS)
    rewritten = set(workload.sub_groups[i])
    for position, key in tail_reads.items():
        if key in rewritten:
            read_in_update[position] = timeline.issue("nvme_read", param_bytes(workload, key), key, store=PARAMS)


def _tencache_memory(workload: Workload, machine: Machine, plan: TencachePlan) -> Dict[str, int]:
    """The largest of three moments' memory (host memory: the tiers they differ in):

    - the steady step's;
    - the start-up split's, through initialisation only: the governor's first reading, before the first forward
      pass, decides with the step's rise assumed (``RisePrior``: the model's rise) where it would give back, so no
      step runs with it (until 2026-11-29 the first two steps did: gpt2-1.3b's did not fit in 16.5 GiB where
      stock's did);
    - the first update's (``_first_update_optimizer_bytes``), on top of what the first backward left."""
    steady_optimizer = (sum(_optimizer_sequence(workload)[1][name] for name in plan.optimizer_held)
                        + sum(plan.optimizer_prefixes.values()) + plan.optimizer_streaming_bytes)
    steady = _memory_with(workload, machine, plan, plan.param_cache_bytes, steady_optimizer)
    start = _memory_with(workload, machine, plan, plan.param_cache_start_bytes, plan.optimizer_start_footprint_bytes,
                         stepping=False)
    moments = [steady, start]
    if workload.zero.offload_optimizer == "nvme":
        moments.append(_memory_with(workload, machine, plan, plan.param_cache_bytes,
                                    _first_update_optimizer_bytes(workload, plan, steady_optimizer)))
    return max(moments, key=lambda memory: memory["pinned"] + memory["pageable"])


def _first_update_optimizer_bytes(workload: Workload, plan: TencachePlan, steady_optimizer: int) -> int:
    """The optimizer's host memory at the first update's peak. Adam creates its moments there, not at initialisation
    (DeepSpeed 0.19.8's ``initialize_optimizer_states`` only swaps each sub-group in and out; CPU Adam initialises its
    state lazily). Where state streams, the streaming slots hold what that update creates: the steady footprint.
    Where the tier keeps the whole state, the tier's copies of the new moments (optimizer_swapper ``_store_new``)
    stand beside Adam's own until the update gives those back: the state's bytes of the largest sub-group once more.

    Measured (scripts/sample_step_rss.py, gpt2-small and gpt2-medium fp32, one sub-group, 2 x 64, 2026-12-04;
    docs/estimate.md, "The first update's memory"): from the first update's start to its peak gpt2-small rose 16 B an
    element of its sub-group streaming and 15 B at a quarter (the gradient's fill, Adam's two moments, a written
    state's slot: what its four streaming slots hold), gpt2-medium 15 B streaming; at "auto" 20 B (the moments' copies into
    the tier 0.90 GiB of the 0.92 priced here), which the steady footprint with these 8 B prices at 24 B (+5% to
    +11% on the runs' peaks). Not measured with several sub-groups. The plan is the steady state's: where "auto"
    keeps the whole state only after growing at a measured step, this prices copies the first update does not
    have (the safe side of "fits")."""
    if len(plan.optimizer_held) < len(_optimizer_sequence(workload)[1]):
        return steady_optimizer
    zero = workload.zero
    return steady_optimizer + workload.largest_sub_group_elements * len(zero.precision.state_names) \
        * zero.precision.state_bytes


def _memory_with(workload: Workload, machine: Machine, plan: TencachePlan, param_cache: int,
                 optimizer_bytes: int, stepping: bool = True) -> Dict[str, int]:
    """One rank's memory per tier with ``param_cache`` bytes of parameter cache slots and ``optimizer_bytes`` of the
    optimizer tier's host memory (kept state and streaming slots, or ``_first_update_optimizer_bytes``); without
    ``stepping`` (initialisation), less what a step's forward and backward hold on a host accelerator, and with the
    initialisation of the largest sub-group where that is more than ``optimizer_bytes`` (and no heap a backward
    left, where initialisation's term stands in for it: ``heap_is_kept``)."""
    zero = workload.zero
    views, at_once = reduces_to_views(workload, machine), partitions_gradients_at_once(workload, machine)
    common = host_resident_bytes(workload, machine, reduce_views=views, bucket_unused=at_once)
    device = common["device"] + (0 if machine.accelerator_is_host else plan.device_tier_bytes)
    slots = plan.param_streaming_bytes + param_cache
    pinned = slots if plan.param_slots_locked else 0
    through_accelerator = _params_off_nvme_bytes(workload)  # stage 3 pins them: pinned on a GPU only
    on_host = common["device_on_host"]
    if stepping and machine.accelerator_is_host and not gathers_alias_partitions(workload, machine):
        on_host += _device_tier_held_bytes(workload, plan)  # gathered copies of their own, in host memory
    if stepping and views:  # the reduce's buffers are not taken (one_rank_reduce.py)
        on_host -= device_step_bytes(workload, True) - device_step_bytes(workload, True, reduce_views=True)
    if not stepping and machine.accelerator_is_host:  # nor the gradient bucket, untouched until a backward
        on_host -= device_step_bytes(workload, host_accelerator=True) + \
            (0 if at_once else reduce_bucket_bytes(workload, True))  # (at once never: host_resident_bytes)
    heap = common["heap"] if stepping or heap_is_kept(machine, views) else 0
    pageable = common["baseline"] + heap + on_host + (0 if plan.param_slots_locked else slots)
    if zero.offload_optimizer != "none" and zero.optimizer_pin_memory:
        through_accelerator += common["gradients"]
    else:
        pageable += common["gradients"]
    if zero.offload_optimizer == "nvme":
        if stepping:
            pageable += optimizer_bytes
        else:
            largest = workload.largest_sub_group_elements
            init = (init_outside_pool_bytes(workload, machine, reduce_views=views)
                    + largest * init_bytes_per_element_pooled(zero))
            pageable += max(init, optimizer_bytes)
    elif zero.offload_optimizer == "cpu":
        states = workload.rank_elements * optimizer_state_bytes_per_element(zero)
        pageable += states  # never pinned: stage 3 copies the masters (``.to().clone()``), Adam's state is its own
        # and each sub-group's gradient in the masters' dtype, a buffer of its own kept for the run, pinned with the
        # optimizer's pin_memory (stage3.py initialize_optimizer_states; helper-223: 25 GiB of llama-7b uncounted)
        if zero.optimizer_pin_memory:
            through_accelerator += workload.rank_elements * zero.precision.master_bytes
        else:
            pageable += workload.rank_elements * zero.precision.master_bytes
    if deepspeed_pins(machine):
        pinned += through_accelerator
    else:  # the same bytes, none of them page-locked (costs.deepspeed_pins)
        pageable += through_accelerator
    return {"device": device, "pinned": pinned, "pageable": pageable,
            "nvme": nvme_space(workload, gradient_files=False)}
