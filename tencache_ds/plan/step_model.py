"""The step model: a training step's time, bytes and memory on a machine, under stock ZeRO-Infinity or tencache,
before anything runs. Owns: replaying one rank's step (plan/workload.py: its gathers, gradients and optimizer
sub-groups) on a timeline of the compute thread and the machine's channels (NVMe read, NVMe write, H2D), with
each policy's rules for when bytes move and who waits; and the memory each tier needs. Does not own: the budgets
tencache chooses (plan/budget.py, plan/host_tier.py, plan/device_tier.py, plan/size_classes.py decide them here
as at run time), which accesses a host tier of a given size serves (plan/host_residency.py) or how far ahead a
read is issued (plan/prefetch.py). Pure: no clock, no I/O, no torch.

The timeline. The compute thread runs the step's work in program order; an NVMe read, an NVMe write or an H2D copy
occupies its channel for ``bytes / bandwidth`` from when it is issued and the channel is free (reads and writes
are separate channels: a drive serves both at once; a read of a tensor waits for the pending write of the same
tensor). The thread waits when it needs bytes still moving; each wait is charged to its channel, so the step is
``compute + H2D wait + NVMe read wait + NVMe write wait + CPU Adam`` (the critical path, printed as such) and the
largest part is the bottleneck. Three steps are replayed and the last one is reported: writes left behind by one
step delay the next step's reads of the same tensors.

Stock (DeepSpeed 0.19.8, deepspeed-integration.md c and d):
- a parameter on NVMe is read at every gather ZeRO-3 does not avoid by its own retention (plan/workload.py);
  the read of the next module's parameters is issued when the current module is fetched (prefetch depth 1,
  d.2/c.3), and the H2D copy from the aio pool is synchronous and pageable-staged (c.3.7);
- gradients go to NVMe at the end of backward (4 bytes per element); the optimizer, per sub-group, reads master,
  moments and gradient, steps, writes master and moments, then writes the sub-group's fp16 partitions, all
  synchronously (PartitionedOptimizerSwapper); with ``pipeline_read``/``pipeline_write`` the next sub-group's
  read and this one's write overlap the step (PipelinedOptimizerSwapper); nothing is held between steps;
- pinned: ``buffer_count x buffer_size`` parameter slots, the fp16 staging area of the largest sub-group,
  ``buffer_count`` optimizer buffers of the largest sub-group.

tencache (docs/design.md; the budgets it would choose, from the same functions as at run time):
- host tier "auto" = plan/budget.resolve_budgets on this machine's memory; parameter slots per size class
  (plan/size_classes.py), cache slots from the host tier first, the rest to optimizer state
  (plan/host_tier.split_host_budget, as the optimizer swapper does); the device tier (plan/device_tier.py) keeps
  gathered parameters by next use;
- a gather served by the device tier moves nothing; a lend served by the host tier reads nothing; the reads left
  are issued ahead by plan/prefetch.PrefetchSchedule within the streaming slots; changed bytes of held tensors are
  written back only on eviction (none in steady state);
- optimizer state not held streams: the first sub-group's is read ahead during backward, the next one's during
  each update, writes go behind (finishing during the next forward).

Known simplifications (docs/estimate.md lists them with their effect): no collective communication (all-gather,
reduce-scatter) time; no per-module framework overhead; host memory bandwidth is one figure for every copy.
"""
import dataclasses
import math
from collections import defaultdict
from typing import Dict, List, Optional, Set, Tuple

from ..config import AUTO
from ..profile.step_profile import StepProfile
from .budget import UNLIMITED, MachineResources, resolve_budgets
from .device_tier import device_tier_budget
from .host_residency import steady_state
from .host_tier import (OPTIMIZER_BYTES_PER_ELEMENT, OPTIMIZER_IO_BYTES_PER_HELD_BYTE,
                        PARAM_IO_BYTES_PER_HELD_BYTE, TierDemand, split_host_budget)
from .machine import Machine
from .prefetch import PrefetchSchedule
from .size_classes import cache_slot_counts, class_bytes, merge_close_classes, size_histogram, streaming_slot_counts
from .workload import Workload

STOCK, TENCACHE = "stock", "tencache"
STEPS_REPLAYED = 3
# Host memory traffic of the optimizer step's epilogue per element on the host, beyond Adam itself: the gradient
# partition copied into the fp32 flat buffer (read 2-4, write 4), its norm for clipping (read 4), unscale/clip in
# place (read 4, write 4), the updated fp32 master cast into the fp16 partition (read 4, write 2).
EPILOGUE_BYTES_PER_ELEMENT = 24
# Stock's H2D copies come from mlock'ed, not CUDA-registered, memory: CUDA stages them through its own pinned
# buffer. NVIDIA's "How to Optimize Data Transfers in CUDA C/C++" measures pageable at about half of pinned.
PAGEABLE_H2D_FACTOR = 0.5
# stage 3 initialising the optimizer of one sub-group holds, per element: its fp16 flat copy (2), the fp32 master
# (4), the zeroed gradient (4) -- and, unless they pass through stock's pinned pool, the master's swap buffer (4),
# the two moments (8) and the gradient's buffer (4) (stage3.initialize_optimizer_states).
INIT_BYTES_PER_ELEMENT_OUTSIDE_POOL = 10
INIT_BYTES_PER_ELEMENT_POOLED = 16
GRADIENT_BYTES_PER_ELEMENT = 4   # stage 3's fp32 gradient partitions (grad_partitions_flat_buffer)
OPTIMIZER_STATE_FILE_BYTES = 12  # fp32 master + two Adam moments, per element
ADAM_STOCK_BUFFERS, ADAM_PIPELINED_BUFFERS = 4, 12  # deepspeed-integration.md a.7


@dataclasses.dataclass
class Prediction:
    """What one policy's step looks like on one rank (bytes per step, per rank; memory per rank)."""

    policy: str
    step_time_s: float
    critical_path_s: Dict[str, float]   # compute, h2d, nvme_read, nvme_write, cpu_adam: the step is their sum
    bottleneck: str
    nvme_read_bytes: int
    nvme_write_bytes: int
    h2d_bytes: int
    memory: Dict[str, int]              # device, pinned, pageable (host), nvme
    device_hit_rate: Optional[float]
    host_hit_rate: Optional[float]
    failures: List[str]                  # why it would not run ("" list: it runs)
    budgets: Dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def host_bytes(self) -> int:
        return self.memory["pinned"] + self.memory["pageable"]

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["host_bytes"] = self.host_bytes
        return out


# ----------------------------------------------------------------------------------------------------- timeline
class _Timeline:
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


# -------------------------------------------------------------------------------------------- shared pieces
@dataclasses.dataclass(frozen=True)
class _Rates:
    flops_per_s: float
    adam_elements_per_s: float
    host_copy_bytes_per_s: float
    channels: Dict[str, float]


def _rates(machine: Machine, pinned_h2d: bool) -> _Rates:
    h2d = machine.h2d_bytes_per_s * (1.0 if pinned_h2d else PAGEABLE_H2D_FACTOR)
    return _Rates(machine.accelerator_flops_per_s, machine.cpu_adam_elements_per_s_per_rank,
                  machine.host_copy_bytes_per_s_per_rank,
                  {"nvme_read": machine.nvme_read_bytes_per_s_per_rank,
                   "nvme_write": machine.nvme_write_bytes_per_s_per_rank, "h2d": h2d})


def _optimizer_cpu_s(workload: Workload, elements: int, rates: _Rates) -> float:
    """CPU Adam and the step's epilogue over ``elements`` (host optimizer only)."""
    return elements / rates.adam_elements_per_s + elements * EPILOGUE_BYTES_PER_ELEMENT / rates.host_copy_bytes_per_s


def optimizer_cpu_seconds(workload: Workload, machine: Machine) -> float:
    """The step's CPU Adam and epilogue on this machine (host optimizer; 0 without optimizer offload)."""
    if workload.zero.offload_optimizer == "none":
        return 0.0
    return _optimizer_cpu_s(workload, workload.rank_elements, _rates(machine, pinned_h2d=True))


def _param_bytes(workload: Workload, key: str) -> int:
    return workload.zero.swap_nbytes(workload.partitions[key].part_numel)


def _gathered_bytes(workload: Workload, key: str) -> int:
    return workload.partitions[key].numel * workload.zero.element_bytes


def _activation_bytes(workload: Workload) -> int:
    return workload.shape.activation_bytes(workload.micro_batch, workload.seq_len, workload.checkpointing,
                                           workload.zero.element_bytes)


def _device_working_bytes(workload: Workload) -> int:
    """Accelerator memory ZeRO-3 needs besides a device tier: the gathered module and the one prefetched after it,
    the prefetch bucket, persistent parameters, the gradient reduce bucket, activations, and model states not
    offloaded."""
    zero, elem = workload.zero, workload.zero.element_bytes
    largest_module = max((sum(_gathered_bytes(workload, key) for key in fetch.keys) for fetch in workload.fetches),
                         default=0)
    persistent = sum(p.numel for p in workload.partitions.values() if p.persistent) * elem
    not_offloaded = 0
    if zero.offload_param == "none":
        not_offloaded += workload.rank_elements * elem
    if zero.offload_optimizer == "none":
        not_offloaded += workload.rank_elements * OPTIMIZER_BYTES_PER_ELEMENT
    return (2 * largest_module + zero.prefetch_bucket_size * elem + persistent
            + min(zero.reduce_bucket_size, workload.rank_elements) * elem + _activation_bytes(workload)
            + not_offloaded)


def _nvme_space(workload: Workload) -> int:
    zero = workload.zero
    space = sum(_param_bytes(workload, key) for key, p in workload.partitions.items() if p.on_nvme)
    if zero.offload_optimizer == "nvme":
        space += sum(zero.swap_nbytes(workload.sub_group_elements(i), 4) * (OPTIMIZER_STATE_FILE_BYTES + 4) // 4
                     for i in range(len(workload.sub_groups)))
    return space


def _read_positions(workload: Workload) -> Dict[int, List[str]]:
    """fetch index -> keys whose partitions the gather needs (ZeRO-3's own retention applied)."""
    reads: Dict[int, List[str]] = defaultdict(list)
    for index, key in workload.read_fetches():
        reads[index].append(key)
    return reads


def _host_resident_bytes(workload: Workload, machine: Machine) -> Dict[str, int]:
    """Host-side bytes every policy has: the process, stage 3's gradient partitions, and (on the CPU
    accelerator) what would be device memory."""
    device = _device_working_bytes(workload)
    return {"baseline": machine.process_baseline_bytes,
            "gradients": workload.rank_elements * GRADIENT_BYTES_PER_ELEMENT,
            "device_on_host": device if machine.accelerator_is_host else 0,
            "device": 0 if machine.accelerator_is_host else device}


# ---------------------------------------------------------------------------------------------------- stock
def predict_stock(workload: Workload, machine: Machine) -> Prediction:
    zero, elem = workload.zero, workload.zero.element_bytes
    rates = _rates(machine, pinned_h2d=False)
    reads = _read_positions(workload)
    nvme_reads = {i: [k for k in keys if workload.partitions[k].on_nvme] for i, keys in reads.items()}
    failures = _stock_failures(workload)
    timeline = _Timeline(rates.channels)
    h2d = not machine.accelerator_is_host
    for _step in range(STEPS_REPLAYED):
        start = timeline.now
        moved_before = dict(timeline.moved)
        parts_before = dict(timeline.parts)
        for micro in range(workload.gas):
            prefetched: Dict[Tuple[int, str], float] = {}
            for index, fetch in enumerate(workload.fetches):
                for key in nvme_reads.get(index, []):
                    done = prefetched.pop((index, key), None)
                    if done is None:
                        done = timeline.issue("nvme_read", _param_bytes(workload, key), key)
                    timeline.wait(done, "nvme_read")
                if h2d and reads.get(index):
                    timeline.wait(timeline.issue("h2d", sum(workload.partitions[k].part_numel * elem
                                                            for k in reads[index])), "h2d")
                for key in nvme_reads.get(index + 1, []):  # one module ahead
                    prefetched[(index + 1, key)] = timeline.issue("nvme_read", _param_bytes(workload, key), key)
                timeline.work(fetch.flops / rates.flops_per_s, "compute")
            if h2d and workload.zero.offload_optimizer != "none":  # gradient partitions to the host
                timeline.wait(timeline.issue("h2d", workload.rank_elements * elem), "h2d")
        _stock_optimizer(workload, timeline, rates)
        step_s = timeline.now - start
    moved = {k: v - moved_before.get(k, 0) for k, v in timeline.moved.items()}
    parts = {k: v - parts_before.get(k, 0.0) for k, v in timeline.parts.items()}
    memory = _stock_memory(workload, machine)
    return _finish(STOCK, step_s, parts, moved, memory, None, None, failures, {})


def _stock_optimizer(workload: Workload, timeline: _Timeline, rates: _Rates) -> None:
    zero = workload.zero
    if zero.offload_optimizer != "nvme":
        if zero.offload_optimizer == "cpu":
            timeline.work(_optimizer_cpu_s(workload, workload.rank_elements, rates), "cpu_adam")
        return
    groups = range(len(workload.sub_groups))
    sizes = {i: workload.sub_group_elements(i) for i in groups}
    for i in groups:  # swap_out_gradients at the end of backward
        timeline.issue("nvme_write", zero.swap_nbytes(sizes[i], 4), f"g{i}")

    def read(i):
        state = timeline.issue("nvme_read", zero.swap_nbytes(sizes[i], 4) * 3, f"s{i}")
        return max(state, timeline.issue("nvme_read", zero.swap_nbytes(sizes[i], 4), f"g{i}"))

    pending_writes: List[float] = []
    ahead = read(0) if zero.pipelined_optimizer else None
    for i in groups:
        done = ahead if zero.pipelined_optimizer else read(i)
        timeline.wait(done, "nvme_read")
        if zero.pipelined_optimizer and i + 1 in sizes:
            ahead = read(i + 1)
        timeline.work(_optimizer_cpu_s(workload, sizes[i], rates), "cpu_adam")
        written = timeline.issue("nvme_write", zero.swap_nbytes(sizes[i], 4) * 3, f"s{i}")
        if zero.pipelined_optimizer:
            pending_writes.append(written)
        else:
            timeline.wait(written, "nvme_write")
        fp16 = sum(_param_bytes(workload, key) for key in workload.sub_groups[i] if workload.partitions[key].on_nvme)
        timeline.wait(timeline.issue("nvme_write", fp16), "nvme_write")  # swap_out_partitioned_params: synchronous
    for written in pending_writes:
        timeline.wait(written, "nvme_write")


def _stock_failures(workload: Workload) -> List[str]:
    """Where stock DeepSpeed 0.19.8 asserts before or during the first steps (deepspeed-integration.md)."""
    zero, failures = workload.zero, []
    swapped = [p for p in workload.partitions.values() if p.on_nvme]
    if swapped:
        largest = max(p.part_numel for p in swapped)
        if largest > zero.param_buffer_size:
            failures.append(f"stock asserts at init: a {largest}-element partition is larger than "
                            f"offload_param.buffer_size {zero.param_buffer_size} (\"More elements ... than buffer "
                            f"size\", DeepSpeed #3506)")
        held = _max_retained_swapped(workload)
        if held > zero.param_buffer_count:
            failures.append(f"stock asserts from the second step: ZeRO-3 keeps {held} NVMe partitions gathered at "
                            f"once (stage3_max_reuse_distance {zero.max_reuse_distance}), more than "
                            f"offload_param.buffer_count {zero.param_buffer_count} (\"Not enough buffers\")")
    if zero.offload_optimizer == "nvme":
        needed = ADAM_PIPELINED_BUFFERS if zero.pipelined_optimizer else ADAM_STOCK_BUFFERS
        if zero.optimizer_buffer_count < needed:
            failures.append(f"stock runs out of optimizer swap buffers: Adam needs {needed} "
                            f"(offload_optimizer.buffer_count is {zero.optimizer_buffer_count})")
    return failures


def _max_retained_swapped(workload: Workload) -> int:
    """The most NVMe partitions ZeRO-3 keeps gathered at once between their uses (each holds a stock slot)."""
    read_at = {(i, k) for i, k in workload.read_fetches()}
    uses: Dict[str, List[int]] = defaultdict(list)
    for index, fetch in enumerate(workload.fetches):
        for key in fetch.keys:
            uses[key].append(index)
    live = [0] * (len(workload.fetches) + 1)
    for key, indices in uses.items():
        if not workload.partitions[key].on_nvme:
            continue
        for first, second in zip(indices, indices[1:]):
            if (second, key) not in read_at:  # retained from its use at `first` to `second`
                for index in range(first, second):
                    live[index] += 1
    return max(live)


def _stock_memory(workload: Workload, machine: Machine) -> Dict[str, int]:
    zero = workload.zero
    common = _host_resident_bytes(workload, machine)
    pinned = 0
    if zero.offload_param == "nvme" and any(p.on_nvme for p in workload.partitions.values()):
        pinned += zero.param_buffer_count * zero.swap_nbytes(zero.param_buffer_size)
        largest = max(range(len(workload.sub_groups)), key=workload.sub_group_elements)
        pinned += sum(zero.swap_nbytes(workload.partitions[k].part_numel) for k in workload.sub_groups[largest])
    largest_group = workload.largest_sub_group_elements
    if zero.offload_param in ("cpu",) or (zero.offload_param == "nvme" and zero.max_in_cpu > 0):
        pinned += sum(p.part_numel for p in workload.partitions.values() if not p.on_nvme) * zero.element_bytes
    pageable = common["baseline"] + common["device_on_host"]
    gradients = common["gradients"]
    if zero.offload_optimizer == "nvme":
        pool = zero.optimizer_buffer_count * zero.swap_nbytes(largest_group, 4)
        pinned += pool if zero.optimizer_pin_memory else 0
        pageable += 0 if zero.optimizer_pin_memory else pool
        pageable += largest_group * (INIT_BYTES_PER_ELEMENT_OUTSIDE_POOL +
                                     max(0, INIT_BYTES_PER_ELEMENT_POOLED - zero.optimizer_buffer_count * 4))
    elif zero.offload_optimizer == "cpu":
        states = workload.rank_elements * OPTIMIZER_STATE_FILE_BYTES
        pinned += states if zero.optimizer_pin_memory else 0
        pageable += 0 if zero.optimizer_pin_memory else states
        pageable += largest_group * INIT_BYTES_PER_ELEMENT_OUTSIDE_POOL  # the same initialisation, in memory
    if zero.offload_optimizer != "none" and zero.optimizer_pin_memory:
        pinned += gradients
    else:
        pageable += gradients
    return {"device": common["device"], "pinned": pinned, "pageable": pageable, "nvme": _nvme_space(workload)}


# ------------------------------------------------------------------------------------------------- tencache
@dataclasses.dataclass(frozen=True)
class TencachePlan:
    """The budgets tencache would choose for this workload on this machine, and what they hold."""

    host_cache_bytes: int
    param_streaming_bytes: int
    param_cache_bytes: int
    optimizer_share_bytes: int
    device_tier_bytes: int
    params_all_held: bool
    optimizer_held: frozenset
    optimizer_streaming_bytes: int


def tencache_plan(workload: Workload, machine: Machine) -> TencachePlan:
    """The budgets, by the same functions the swappers call at run time."""
    zero = workload.zero
    config = zero.tencache
    swapped = {key: _param_bytes(workload, key) for key, p in workload.partitions.items() if p.on_nvme}
    histogram = merge_close_classes(size_histogram(swapped.values()))
    streaming = class_bytes(streaming_slot_counts(histogram, max(1, zero.param_buffer_count))) if swapped else 0
    resources = MachineResources(host_total_bytes=machine.host_memory_bytes,
                                 host_available_bytes=machine.available_host_bytes,
                                 memlock_limit_bytes=UNLIMITED,
                                 device_free_bytes=0 if machine.accelerator_is_host else
                                 max(0, machine.accelerator_memory_bytes - _device_working_bytes(workload)),
                                 local_world_size=machine.ranks_per_node)
    budgets = resolve_budgets(config, resources, stream_min_bytes=streaming)
    host = budgets.host_cache_bytes
    cache_counts = cache_slot_counts(histogram, streaming_slot_counts(histogram, max(1, zero.param_buffer_count)),
                                     host) if swapped else {}
    param_cache = class_bytes(cache_counts)
    all_swapped = sum(size for size in swapped.values())
    params_all_held = bool(swapped) and streaming + param_cache >= class_bytes(histogram)
    demands = [TierDemand("params", param_cache, PARAM_IO_BYTES_PER_HELD_BYTE)]
    if zero.offload_optimizer == "nvme":
        demands.append(TierDemand("optimizer", max(workload.rank_elements * OPTIMIZER_BYTES_PER_ELEMENT, host),
                                  OPTIMIZER_IO_BYTES_PER_HELD_BYTE))
    shares = split_host_budget(host, demands)
    optimizer_share = shares.get("optimizer", 0)
    held = frozenset()
    optimizer_streaming = 0
    if zero.offload_optimizer == "nvme":
        keys, sizes = _optimizer_sequence(workload)
        held = steady_state(keys, sizes, optimizer_share).held
        if len(held) < len(sizes):  # a sub-group's four tensors stream through slots (twice: one read ahead)
            largest = zero.swap_nbytes(workload.largest_sub_group_elements, 4)
            optimizer_streaming = largest * 4 * (2 if len(workload.sub_groups) > 1 else 1)
    param_capacity = all_swapped if params_all_held else param_cache
    device_free = resources.device_free_bytes
    device = device_tier_budget(config.device_cache_bytes, machine.accelerator_is_host, param_capacity,
                                device_free, 0.5) if config.device_cache_bytes != 0 else 0
    return TencachePlan(host, streaming, param_cache, optimizer_share, device, params_all_held, held,
                        optimizer_streaming)


def _optimizer_sequence(workload: Workload) -> Tuple[List[str], Dict[str, int]]:
    """The optimizer store's accesses in a step: each sub-group's gradient in backward, then per sub-group its
    master, two moments and gradient in the update."""
    zero, keys, sizes = workload.zero, [], {}
    for i in range(len(workload.sub_groups)):
        nbytes = zero.swap_nbytes(workload.sub_group_elements(i), 4)
        for name in ("p", "m", "v", "g"):
            sizes[f"{name}{i}"] = nbytes
    keys += [f"g{i}" for i in range(len(workload.sub_groups))]
    for i in range(len(workload.sub_groups)):
        keys += [f"p{i}", f"m{i}", f"v{i}", f"g{i}"]
    return keys, sizes


def predict_tencache(workload: Workload, machine: Machine) -> Prediction:
    zero, elem = workload.zero, workload.zero.element_bytes
    plan = tencache_plan(workload, machine)
    rates = _rates(machine, pinned_h2d=True)
    gathers = workload.read_fetches()
    # the device tier: gathered parameters kept between uses, chosen by next use
    gather_keys = [key for _index, key in gathers]
    device = steady_state(gather_keys, {k: _gathered_bytes(workload, k) for k in gather_keys}, plan.device_tier_bytes) \
        if gathers else None
    device_miss = [gathers[position] for position in sorted(device.misses)] if device else []
    lends = [(index, key) for index, key in device_miss if workload.partitions[key].on_nvme]
    lend_keys = [key for _index, key in lends]
    sizes = {key: _param_bytes(workload, key) for key in lend_keys}
    if plan.params_all_held:
        host_misses: Set[int] = set()
    else:
        host_misses = set(steady_state(lend_keys, sizes, plan.param_cache_bytes).misses) if lends else set()
    schedule = _param_schedule(workload, lends, host_misses, rates, plan.param_streaming_bytes)
    lend_at: Dict[int, List[int]] = defaultdict(list)
    for position, (index, _key) in enumerate(lends):
        lend_at[index].append(position)
    gather_at: Dict[int, List[str]] = defaultdict(list)
    for index, key in device_miss:
        gather_at[index].append(key)
    written_params = {key for position, key in enumerate(lend_keys) if position in host_misses}
    timeline = _Timeline(rates.channels)
    h2d = not machine.accelerator_is_host
    opt_keys, opt_sizes = _optimizer_sequence(workload)
    streams = zero.offload_optimizer == "nvme"
    first_backward = next((i for i, f in enumerate(workload.fetches) if f.phase != "forward"), 0)
    for _step in range(STEPS_REPLAYED):
        start = timeline.now
        moved_before = dict(timeline.moved)
        parts_before = dict(timeline.parts)
        ahead: Dict[str, float] = {}
        for micro in range(workload.gas):
            issued: Dict[int, float] = {}
            for index, fetch in enumerate(workload.fetches):
                if streams and micro == workload.gas - 1 and index == first_backward:
                    for name in ("p0", "m0", "v0"):  # the first sub-group's state, read during backward
                        if name not in plan.optimizer_held:
                            ahead[name] = timeline.issue("nvme_read", opt_sizes[name], name)
                for position in lend_at.get(index, []):
                    if position in host_misses:
                        done = issued.pop(position, None)
                        if done is None:
                            done = timeline.issue("nvme_read", sizes[lend_keys[position]], lend_keys[position])
                        timeline.wait(done, "nvme_read")
                    for target in (schedule.to_issue(position) if schedule else ()):
                        if target > position and target not in issued:
                            issued[target] = timeline.issue("nvme_read", sizes[lend_keys[target]], lend_keys[target])
                if h2d and gather_at.get(index):
                    timeline.wait(timeline.issue("h2d", sum(workload.partitions[k].part_numel * elem
                                                            for k in gather_at[index])), "h2d")
                timeline.work(fetch.flops / rates.flops_per_s, "compute")
            if h2d and zero.offload_optimizer != "none":
                timeline.wait(timeline.issue("h2d", workload.rank_elements * elem), "h2d")
        if streams:
            for i in range(len(workload.sub_groups)):
                if f"g{i}" not in plan.optimizer_held:
                    timeline.issue("nvme_write", opt_sizes[f"g{i}"], f"g{i}")
            _tencache_optimizer(workload, timeline, rates, plan, opt_sizes, ahead, written_params)
        elif zero.offload_optimizer == "cpu":
            timeline.work(_optimizer_cpu_s(workload, workload.rank_elements, rates), "cpu_adam")
        step_s = timeline.now - start
    moved = {k: v - moved_before.get(k, 0) for k, v in timeline.moved.items()}
    parts = {k: v - parts_before.get(k, 0.0) for k, v in timeline.parts.items()}
    device_rate = 1.0 - len(device.misses) / len(gathers) if device and gathers else None
    host_rate = 1.0 - len(host_misses) / len(lends) if lends else None
    memory = _tencache_memory(workload, machine, plan)
    failures = []
    budgets = {"host_cache_bytes": plan.host_cache_bytes, "param_streaming_bytes": plan.param_streaming_bytes,
               "param_cache_bytes": plan.param_cache_bytes, "optimizer_share_bytes": plan.optimizer_share_bytes,
               "device_cache_bytes": plan.device_tier_bytes}
    return _finish(TENCACHE, step_s, parts, moved, memory, device_rate, host_rate, failures, budgets)


def _param_schedule(workload: Workload, lends, misses: Set[int], rates: _Rates,
                    in_flight_bytes: int) -> Optional[PrefetchSchedule]:
    """plan/prefetch.py's schedule over the lends of one micro-step, with the compute between them."""
    if not misses:
        return None
    elapsed = 0.0
    lend_index = 0
    offsets = []
    for index, fetch in enumerate(workload.fetches):
        while lend_index < len(lends) and lends[lend_index][0] == index:
            offsets.append(elapsed)
            lend_index += 1
        elapsed += fetch.flops / rates.flops_per_s
    keys = [key for _index, key in lends]
    profile = StepProfile(tuple(keys), tuple(_param_bytes(workload, key) for key in keys), tuple(offsets),
                          (None,) * len(keys), (0.0,) * (len(keys) + 1), elapsed)
    return PrefetchSchedule.from_profile(profile, rates.channels["nvme_read"], max(1, in_flight_bytes),
                                         reads_at=misses)


def _tencache_optimizer(workload: Workload, timeline: _Timeline, rates: _Rates, plan: TencachePlan,
                        sizes: Dict[str, int], ahead: Dict[str, float], written_params: Set[str]) -> None:
    groups = len(workload.sub_groups)

    def read(i: int) -> None:
        for name in (f"p{i}", f"m{i}", f"v{i}", f"g{i}"):
            if name not in plan.optimizer_held and name not in ahead:
                ahead[name] = timeline.issue("nvme_read", sizes[name], name)

    for i in range(groups):
        read(i)
        for name in (f"p{i}", f"m{i}", f"v{i}", f"g{i}"):
            if name in ahead:
                timeline.wait(ahead.pop(name), "nvme_read")
        if i + 1 < groups:
            read(i + 1)
        timeline.work(_optimizer_cpu_s(workload, workload.sub_group_elements(i), rates), "cpu_adam")
        # written behind, in stage 3's order (the sub-group's fp16 partitions, then its optimizer state); the next
        # step's reads of the same tensors wait for them
        for key in workload.sub_groups[i]:
            if key in written_params:
                timeline.issue("nvme_write", _param_bytes(workload, key), key)
        for name in (f"p{i}", f"m{i}", f"v{i}"):
            if name not in plan.optimizer_held:
                timeline.issue("nvme_write", sizes[name], name)


def _tencache_memory(workload: Workload, machine: Machine, plan: TencachePlan) -> Dict[str, int]:
    zero = workload.zero
    common = _host_resident_bytes(workload, machine)
    device = common["device"] + (0 if machine.accelerator_is_host else plan.device_tier_bytes)
    pinned = plan.param_streaming_bytes + plan.param_cache_bytes
    if zero.offload_param == "cpu" or (zero.offload_param == "nvme" and zero.max_in_cpu > 0):
        pinned += sum(p.part_numel for p in workload.partitions.values() if not p.on_nvme) * zero.element_bytes
    pageable = common["baseline"] + common["device_on_host"]
    if zero.offload_optimizer != "none" and zero.optimizer_pin_memory:
        pinned += common["gradients"]
    else:
        pageable += common["gradients"]
    if zero.offload_optimizer == "nvme":
        largest = workload.largest_sub_group_elements
        init = largest * (INIT_BYTES_PER_ELEMENT_OUTSIDE_POOL + INIT_BYTES_PER_ELEMENT_POOLED)
        held = sum(_optimizer_sequence(workload)[1][name] for name in plan.optimizer_held)
        pageable += max(init, held + plan.optimizer_streaming_bytes)
    elif zero.offload_optimizer == "cpu":
        states = workload.rank_elements * OPTIMIZER_STATE_FILE_BYTES
        pinned += states if zero.optimizer_pin_memory else 0
        pageable += 0 if zero.optimizer_pin_memory else states
    return {"device": device, "pinned": pinned, "pageable": pageable, "nvme": _nvme_space(workload)}


# ------------------------------------------------------------------------------------------------- results
def _finish(policy, step_s, parts, moved, memory, device_rate, host_rate, failures, budgets) -> Prediction:
    critical = {name: parts.get(name, 0.0) for name in ("compute", "h2d", "nvme_read", "nvme_write", "cpu_adam")}
    bottleneck = max(critical, key=critical.get) if step_s > 0 else "compute"
    return Prediction(policy, step_s, critical, bottleneck, int(moved.get("nvme_read", 0)),
                      int(moved.get("nvme_write", 0)), int(moved.get("h2d", 0)), memory, device_rate, host_rate,
                      list(failures), budgets)


def fits(prediction: Prediction, workload: Workload, machine: Machine) -> Tuple[bool, List[str]]:
    """Whether one rank's (and a node's) memory holds what the prediction needs, with the reasons when not."""
    reasons = list(prediction.failures)
    if not machine.accelerator_is_host and prediction.memory["device"] > machine.accelerator_memory_bytes:
        reasons.append(f"accelerator memory: needs {prediction.memory['device']} B per rank, has "
                       f"{machine.accelerator_memory_bytes} B")
    node_host = prediction.host_bytes * machine.ranks_per_node
    if node_host > machine.available_host_bytes:
        reasons.append(f"host memory: the node's {machine.ranks_per_node} rank(s) need {node_host} B, "
                       f"{machine.available_host_bytes} B available")
    return not reasons, reasons


def drive_days_to_tbw(prediction: Prediction, machine: Machine, drive_tbw_bytes: Optional[float]) -> Optional[float]:
    """Days of continuous training until each drive has absorbed its rated TBW at this step's write rate (the
    node's ranks write to the node's drives, evenly); None without a rating, inf when nothing is written."""
    if not drive_tbw_bytes:
        return None
    per_drive_per_step = prediction.nvme_write_bytes * machine.ranks_per_node / max(1, machine.drives)
    if per_drive_per_step <= 0 or prediction.step_time_s <= 0:
        return math.inf
    return drive_tbw_bytes / (per_drive_per_step * 86400.0 / prediction.step_time_s)


def predict(workload: Workload, machine: Machine) -> Dict[str, Prediction]:
    """Both policies: stock ZeRO-Infinity, and tencache with the budgets it would choose (its "tencache" block from
    the DeepSpeed config, else the defaults: "auto" budgets)."""
    from ..config import TencacheConfig
    if "nvme" not in (workload.zero.offload_param, workload.zero.offload_optimizer):
        # tencache replaces the NVMe swappers only: without NVMe offload the run is stock DeepSpeed
        stock = predict_stock(workload, machine)
        return {STOCK: stock, TENCACHE: dataclasses.replace(stock, policy=TENCACHE)}
    tencache_workload = workload if workload.zero.tencache is not None else dataclasses.replace(
        workload, zero=dataclasses.replace(workload.zero, tencache=TencacheConfig(host_cache_bytes=AUTO,
                                                                                  device_cache_bytes=AUTO)))
    return {STOCK: predict_stock(workload, machine), TENCACHE: predict_tencache(tencache_workload, machine)}
