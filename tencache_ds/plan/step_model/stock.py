"""The step under stock ZeRO-Infinity (DeepSpeed 0.19.8, deepspeed-integration.md c and d): its replay, where
stock asserts, and the memory it locks. Pure.

- a parameter on NVMe is read at every gather ZeRO-3 does not avoid by its own retention (plan/workload.py);
  the read of the next module's parameters is issued when the current module is fetched (prefetch depth 1,
  d.2/c.3), and the H2D copy from the aio pool is synchronous and pageable-staged (c.3.7);
- gradients go to NVMe at the end of backward (in the masters' dtype); the optimizer, per sub-group, reads master,
  moments and gradient, steps, writes master and moments, then writes the sub-group's fp16 partitions, all
  synchronously (PartitionedOptimizerSwapper); with ``pipeline_read``/``pipeline_write`` the next sub-group's
  read and this one's write overlap the step (PipelinedOptimizerSwapper); nothing is held between steps;
- pinned: ``buffer_count x buffer_size`` parameter slots, the fp16 staging area of the largest sub-group,
  ``buffer_count`` optimizer buffers of the largest sub-group (locked by the aio handle on any accelerator); what
  stage 3 pins through the accelerator on a GPU only (``_stock_memory``).
"""
from collections import defaultdict
from typing import Dict, List, Tuple

from ..host_tier import tensors_per_update
from ..machine import Machine
from ..workload import Workload, ZeroSettings
from .costs import (allgather_s, backward_host_memory_s, deepspeed_pins, host_resident_bytes,
                    init_outside_pool_bytes, init_bytes_per_element_pooled, module_compute_s, nvme_space,
                    optimizer_cpu_s, optimizer_state_bytes_per_element, param_bytes, persistent_keys,
                    reduce_scatter_s, sub_group_file_bytes)
from .results import STOCK, Prediction, finish
from .timeline import OPTIMIZER, PARAMS, STEPS_REPLAYED, Pending, Rates, Timeline, channel_rates

# Operations a pipelined optimizer swapper keeps alive at once: the sub-group read now, the next one read ahead, the
# last one written behind (deepspeed-integration.md a.7: Adam needs 3 x 4 = 12 buffers)
PIPELINED_SUB_GROUPS = 3


def stock_optimizer_buffers(zero: ZeroSettings) -> int:
    """The optimizer swap buffers stock needs: a sub-group's master, state tensors and gradient at once
    (swap_info.num_tensors() + 1: Adam 4), for each operation the pipelined swapper keeps alive (Adam 12)."""
    per_sub_group = tensors_per_update(len(zero.precision.state_names))
    return per_sub_group * (PIPELINED_SUB_GROUPS if zero.pipelined_optimizer else 1)


def predict_stock(workload: Workload, machine: Machine) -> Prediction:
    elem = workload.zero.element_bytes
    rates = channel_rates(machine, arena_buffers=False)
    reads = _read_positions(workload)
    nvme_reads = {i: [k for k in keys if workload.partitions[k].on_nvme] for i, keys in reads.items()}
    failures = _stock_failures(workload)
    timeline = rates.timeline()
    h2d = not machine.accelerator_is_host
    for _step in range(STEPS_REPLAYED):
        start = timeline.now
        moved_before = dict(timeline.moved)
        parts_before = dict(timeline.parts)
        busy_before = dict(timeline.busy)
        for micro in range(workload.gas):
            prefetched: Dict[Tuple[int, str], Pending] = {}
            for index, fetch in enumerate(workload.fetches):
                for key in nvme_reads.get(index, []):
                    done = prefetched.pop((index, key), None)
                    if done is None:
                        done = timeline.issue("nvme_read", param_bytes(workload, key), key, store=PARAMS)
                    timeline.wait(done, "nvme_read")
                if h2d and workload.zero.offload_param != "none" and reads.get(index):  # (none: on the device)
                    timeline.wait(timeline.issue("h2d", sum(workload.partitions[k].part_numel * elem
                                                            for k in reads[index])), "h2d")
                for key in nvme_reads.get(index + 1, []):  # one module ahead
                    prefetched[(index + 1, key)] = timeline.issue("nvme_read", param_bytes(workload, key), key,
                                                                  store=PARAMS)
                timeline.work(allgather_s(workload, machine, reads.get(index, [])), "collective")
                timeline.work(module_compute_s(fetch, rates), "compute")
            timeline.work(backward_host_memory_s(workload, machine, micro), "compute")
            timeline.work(reduce_scatter_s(workload, machine), "collective")
            if h2d and workload.zero.offload_optimizer != "none":  # gradient partitions to the host
                timeline.wait(timeline.issue("h2d", workload.rank_elements * elem), "h2d")
        _stock_optimizer(workload, timeline, rates)
        timeline.work(allgather_s(workload, machine, persistent_keys(workload)), "collective")
        step_s = timeline.now - start
    moved = {k: v - moved_before.get(k, 0) for k, v in timeline.moved.items()}
    parts = {k: v - parts_before.get(k, 0.0) for k, v in timeline.parts.items()}
    step_s = timeline.steady_step(step_s, parts, busy_before)
    memory = _stock_memory(workload, machine)
    return finish(STOCK, step_s, parts, moved, memory, None, None, failures, {})


def _stock_optimizer(workload: Workload, timeline: Timeline, rates: Rates) -> None:
    zero = workload.zero
    if zero.offload_optimizer != "nvme":
        # each sub-group's Adam, then its partitions written back: stage 3 swaps a sub-group's parameters out after
        # its update wherever they live on NVMe, the optimizer on the host or the device (whose Adam is not priced)
        for i in range(len(workload.sub_groups)):
            if zero.offload_optimizer == "cpu":
                timeline.work(optimizer_cpu_s(workload, workload.sub_group_elements(i), rates), "cpu_adam")
            _swap_out_partitions(workload, timeline, i)
        return
    groups = range(len(workload.sub_groups))
    files = {i: sub_group_file_bytes(zero, workload.sub_group_elements(i)) for i in groups}
    sizes = {i: workload.sub_group_elements(i) for i in groups}

    states = zero.precision.state_names
    request_bytes = {i: files[i][states[0]] for i in groups}  # a state tensor's request

    def state_bytes(i):  # the master and each state tensor (Adam's two moments): a request each
        return files[i]["master"] + sum(files[i][name] for name in states)

    for i in groups:  # swap_out_gradients at the end of backward
        timeline.issue("nvme_write", files[i]["gradient"], f"g{i}", store=OPTIMIZER)

    def read(i):
        state = timeline.issue("nvme_read", state_bytes(i), f"s{i}", request_bytes=request_bytes[i], store=OPTIMIZER)
        return [state, timeline.issue("nvme_read", files[i]["gradient"], f"g{i}", store=OPTIMIZER)]

    pending_writes: List[Pending] = []
    ahead = read(0) if zero.pipelined_optimizer else None
    for i in groups:
        done = ahead if zero.pipelined_optimizer else read(i)
        timeline.wait(done, "nvme_read")
        if zero.pipelined_optimizer and i + 1 in sizes:
            ahead = read(i + 1)
        timeline.work(optimizer_cpu_s(workload, sizes[i], rates), "cpu_adam")
        written = timeline.issue("nvme_write", state_bytes(i), f"s{i}", request_bytes=request_bytes[i],
                                 store=OPTIMIZER)
        if zero.pipelined_optimizer:
            pending_writes.append(written)
        else:
            timeline.wait(written, "nvme_write")
        _swap_out_partitions(workload, timeline, i)
    for written in pending_writes:
        timeline.wait(written, "nvme_write")


def _swap_out_partitions(workload: Workload, timeline: Timeline, i: int) -> None:
    """swap_out_partitioned_params of sub-group ``i``: a request per partition on NVMe, waited for together
    (synchronous)."""
    swapped = [timeline.issue("nvme_write", param_bytes(workload, key), store=PARAMS)
               for key in workload.sub_groups[i] if workload.partitions[key].on_nvme]
    timeline.wait(swapped, "nvme_write")


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
        needed = stock_optimizer_buffers(zero)
        if zero.optimizer_buffer_count < needed:
            failures.append(f"stock runs out of optimizer swap buffers: it needs {needed} "
                            f"(offload_optimizer.buffer_count is {zero.optimizer_buffer_count})")
        if zero.precision.master_key:
            failures.append(f"stock stops at its first optimizer step with {zero.precision.master_key}: its "
                            f"optimizer swap buffers are in the masters' dtype, the swapped-out master's placeholder "
                            f"is fp32 (\"assert dtype == self.dtype\", swap_tensor/utils.py; measured with bf16 "
                            f"masters, with and without bf16_optimizer_states)")
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
    """Stock's memory per tier. Pinned: the swap buffers, which the aio handle page-locks itself
    (``new_cpu_locked_tensor``: mlock) on any accelerator, the optimizer's pool whatever its ``pin_memory``
    (``SwapBufferManager``); and what stage 3 pins through the accelerator (the gradient buffer, partitions kept off
    NVMe), pinned on a GPU only (``costs.deepspeed_pins``). CPU-offloaded optimizer state is pageable on either."""
    zero = workload.zero
    common = host_resident_bytes(workload, machine, reduce_views=False)  # stock's reduce is its own
    pinned = through_accelerator = 0
    if zero.offload_param == "nvme":  # the swapper's pool, made with it (partition_parameters.py), whatever is swapped
        pinned += zero.param_buffer_count * zero.swap_nbytes(zero.param_buffer_size)
    if zero.offload_param == "nvme" and any(p.on_nvme for p in workload.partitions.values()):
        # stage 3's buffer for the updated partitions' swap-out (reserve_partitioned_swap_space), sized from the
        # largest sub-group's whole parameters (``ds_numel``), not this rank's partitions: world size times them
        # (helper-212: 8 ranks' llama-70b was priced 14 GB a rank short, "fits" for a stock run that could not)
        largest = max(range(len(workload.sub_groups)), key=workload.sub_group_elements)
        pinned += sum(zero.swap_nbytes(workload.partitions[k].numel) for k in workload.sub_groups[largest])
    largest_group = workload.largest_sub_group_elements
    through_accelerator += workload.params_in_host_memory_elements * zero.element_bytes
    pageable = common["baseline"] + common["heap"] + common["device_on_host"]
    gradients = common["gradients"]
    if zero.offload_optimizer == "nvme":
        pinned += zero.optimizer_buffer_count * zero.swap_nbytes(largest_group, zero.precision.master_bytes)
        pooled = max(0, init_bytes_per_element_pooled(zero) - zero.optimizer_buffer_count * zero.precision.master_bytes)
        pageable += init_outside_pool_bytes(workload, machine, reduce_views=False) + largest_group * pooled
    elif zero.offload_optimizer == "cpu":
        states = workload.rank_elements * optimizer_state_bytes_per_element(zero)
        pageable += states  # never pinned: stage 3 copies the masters (``.to().clone()``), Adam's state is its own
        # and each sub-group's gradient in the masters' dtype, a buffer of its own kept for the run, pinned with the
        # optimizer's pin_memory (stage3.py initialize_optimizer_states; helper-223: 25 GiB of llama-7b uncounted)
        if zero.optimizer_pin_memory:
            through_accelerator += workload.rank_elements * zero.precision.master_bytes
        else:
            pageable += workload.rank_elements * zero.precision.master_bytes
        # the same initialisation, in memory
        pageable += init_outside_pool_bytes(workload, machine, reduce_views=False)
    if zero.offload_optimizer != "none" and zero.optimizer_pin_memory:
        through_accelerator += gradients
    else:
        pageable += gradients
    if deepspeed_pins(machine):
        pinned += through_accelerator
    else:  # the same bytes, none of them page-locked
        pageable += through_accelerator
    return {"device": common["device"], "pinned": pinned, "pageable": pageable,
            "nvme": nvme_space(workload, gradient_files=True)}


def _read_positions(workload: Workload) -> Dict[int, List[str]]:
    """fetch index -> keys whose partitions the gather needs (ZeRO-3's own retention applied)."""
    reads: Dict[int, List[str]] = defaultdict(list)
    for index, key in workload.read_fetches():
        reads[index].append(key)
    return reads
