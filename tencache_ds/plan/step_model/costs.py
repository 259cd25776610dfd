"""What both policies' replays share about a workload: the bytes of its tensors on file and gathered, the memory
every policy has (ZeRO-3's working set on the accelerator, the process, gradient partitions), its NVMe space, and
the CPU time of the optimizer step. Pure."""
from typing import Dict

from ..host_tier import OPTIMIZER_BYTES_PER_ELEMENT
from ..machine import Machine
from ..workload import Workload
from .timeline import Rates, channel_rates

# Host memory traffic of the optimizer step's epilogue per element on the host, beyond Adam itself: the gradient
# partition copied into the fp32 flat buffer (read 2-4, write 4), its norm for clipping (read 4), unscale/clip in
# place (read 4, write 4), the updated fp32 master cast into the fp16 partition (read 4, write 2).
EPILOGUE_BYTES_PER_ELEMENT = 24
# stage 3 initialising the optimizer of one sub-group holds, per element: its fp16 flat copy (2), the fp32 master
# (4), the zeroed gradient (4) -- and, unless they pass through stock's pinned pool, the master's swap buffer (4),
# the two moments (8) and the gradient's buffer (4) (stage3.initialize_optimizer_states).
INIT_BYTES_PER_ELEMENT_OUTSIDE_POOL = 10
INIT_BYTES_PER_ELEMENT_POOLED = 16
GRADIENT_BYTES_PER_ELEMENT = 4   # stage 3's fp32 gradient partitions (grad_partitions_flat_buffer)
OPTIMIZER_STATE_FILE_BYTES = 12  # fp32 master + two Adam moments, per element


def optimizer_cpu_s(workload: Workload, elements: int, rates: Rates) -> float:
    """CPU Adam and the step's epilogue over ``elements`` (host optimizer only)."""
    return elements / rates.adam_elements_per_s + elements * EPILOGUE_BYTES_PER_ELEMENT / rates.host_copy_bytes_per_s


def optimizer_cpu_seconds(workload: Workload, machine: Machine) -> float:
    """The step's CPU Adam and epilogue on this machine (host optimizer; 0 without optimizer offload)."""
    if workload.zero.offload_optimizer == "none":
        return 0.0
    return optimizer_cpu_s(workload, workload.rank_elements, channel_rates(machine, pinned_h2d=True))


def param_bytes(workload: Workload, key: str) -> int:
    return workload.zero.swap_nbytes(workload.partitions[key].part_numel)


def gathered_bytes(workload: Workload, key: str) -> int:
    return workload.partitions[key].numel * workload.zero.element_bytes


def _activation_bytes(workload: Workload) -> int:
    return workload.shape.activation_bytes(workload.micro_batch, workload.seq_len, workload.checkpointing,
                                           workload.zero.element_bytes)


def device_working_bytes(workload: Workload) -> int:
    """Accelerator memory ZeRO-3 needs besides a device tier: the gathered module and the one prefetched after it,
    the prefetch bucket, persistent parameters, the gradient reduce bucket, activations, and model states not
    offloaded."""
    zero, elem = workload.zero, workload.zero.element_bytes
    largest_module = max((sum(gathered_bytes(workload, key) for key in fetch.keys) for fetch in workload.fetches),
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


def nvme_space(workload: Workload) -> int:
    zero = workload.zero
    space = sum(param_bytes(workload, key) for key, p in workload.partitions.items() if p.on_nvme)
    if zero.offload_optimizer == "nvme":
        space += sum(zero.swap_nbytes(workload.sub_group_elements(i), 4) * (OPTIMIZER_STATE_FILE_BYTES + 4) // 4
                     for i in range(len(workload.sub_groups)))
    return space


def host_resident_bytes(workload: Workload, machine: Machine) -> Dict[str, int]:
    """Host-side bytes every policy has: the process, stage 3's gradient partitions, and (on the CPU
    accelerator) what would be device memory."""
    device = device_working_bytes(workload)
    return {"baseline": machine.process_baseline_bytes,
            "gradients": workload.rank_elements * GRADIENT_BYTES_PER_ELEMENT,
            "device_on_host": device if machine.accelerator_is_host else 0,
            "device": 0 if machine.accelerator_is_host else device}
