"""What both policies' replays share about a workload: the bytes of its tensors on file and gathered, the memory
every policy has (ZeRO-3's working set on the accelerator, the process, gradient partitions), its NVMe space, and
the CPU time of the optimizer step. Pure."""
from typing import Dict, Optional

from ..machine import Machine
from ..memory_pressure import RisePrior, stage3_rise_prior
from ..workload import Workload, ZeroSettings
from .timeline import Rates, channel_rates

# Host memory traffic of the optimizer step's epilogue per element on the host, beyond Adam itself: the gradient
# partition copied into the fp32 flat buffer (read 2-4, write 4), unscale/clip in place (read 4, write 4), the
# updated fp32 master cast into the fp16 partition (read 4, write 2). The norm for clipping was taken in backward
# (NORM_FLOAT64_BYTES below); the step only adds up the per-parameter norms.
EPILOGUE_BYTES_PER_ELEMENT = 20
# stage 3 initialising the optimizer of one sub-group holds, per element: its fp16 flat copy (2), the master and
# the zeroed gradient (fp32: 4 each) -- and, unless they pass through stock's pinned pool, the master's swap buffer
# (4), the state tensors (Adam's two moments: 8) and the gradient's buffer (4) (stage3.initialize_optimizer_states).
# The flat copy is counted at 2 bytes whatever the model's dtype: so the fp32 runs of docs/estimate.md were
# predicted.
INIT_FLAT_COPY_BYTES = 2


def init_bytes_per_element_outside_pool(zero: ZeroSettings) -> int:
    """fp32 masters: 10."""
    return INIT_FLAT_COPY_BYTES + 2 * zero.precision.master_bytes


def init_outside_pool_bytes(workload: Workload, machine: Machine, *, reduce_views: bool) -> int:
    """Stage 3's initialisation outside the pool, of the largest sub-group; 0 where stock's heap (``heap_is_kept``:
    ``heap_kept_bytes`` at 10 B an element) stands in its place (measured there: a step's peak does not follow the
    largest sub-group)."""
    if heap_is_kept(machine, reduce_views):
        return 0
    return workload.largest_sub_group_elements * init_bytes_per_element_outside_pool(workload.zero)


def init_bytes_per_element_pooled(zero: ZeroSettings) -> int:
    """The master's and gradient's buffers and the state tensors, per element (fp32 Adam: 16)."""
    return 2 * zero.precision.master_bytes + len(zero.precision.state_names) * zero.precision.state_bytes
# On a host accelerator each micro-batch's backward writes fresh host memory, 2 to 3 times the model's gathered
# bytes: the gradients autograd allocates, the reduce bucket stage 3 concatenates, the reduced copies; freed again
# at the step (large blocks go back to the kernel), so the next backward faults its pages in once more. Measured
# as minor page faults during engine.backward (a step's faults x 4 KiB, after the first step), less those of the
# clipping norm's float64 copies, which are priced apart (``norm_fresh_elements``), fp32, one rank
# (scripts/count_fresh_memory.py, 2026-11-29): gpt2-tiny 116-188 MiB for 15.2 M parameters, of which the norm 0-72
# (2.0 x 4 B without it); gpt2-small 1658-1694 MiB for 124 M, norm 294-312 (2.9 x); gpt2-medium 3354-4398 MiB for
# 355 M, norm 420-1491 (2.2 x); gpt2-1.3b ("auto", micro-batch 1 x 32) 18748-19943 MiB for 1276 M, norm
# 8500-8533 (2.1-2.4 x). Until 2026-11-29 3.5, measured on gpt2-tiny and gpt2-small with the norm's copies
# included; bf16 gpt2-tiny 3.8 x 2 B then. Stock NVMe and tencache alike. At GAS 2 a micro-batch faulted less:
# beyond GAS 1 this may overstate.
BACKWARD_FRESH_BYTES_PER_GATHERED_BYTE = 2.5
# Beside those fresh writes, stage 3's gradient epilogue on a host accelerator passes over every gradient element in
# memory already mapped (DeepSpeed 0.19.8 with its defaults, contiguous_gradients and reduce_scatter on), counted in
# passes of the gradient's element bytes, each a read or a write:
# - every micro-batch, over the whole gathered gradient: its copy into the reduce bucket
#   (__add_grad_to_ipg_bucket: 2), the read of the bucket that reduce_scatter_coalesced concatenates into a new
#   flat buffer (1; the write is fresh), that buffer's pre-divide in place (div_: 2);
# - every micro-batch, over the rank's partition: the reduce-scatter's copy into its output (2: gloo's, not stage
#   3's code; at one rank timed apart at a fresh write plus a copy, docs/estimate.md; at several ranks the
#   collective's own traffic is priced apart, ``reduce_scatter_s``), and the partition into its gradient
#   buffer (partition_grads: copy_ 2 on the first micro-batch; add_ 3 after it, on a host accelerator in place);
# - at the boundary, over the rank's partition: the float64 norm of each gradient for clipping
#   (_constant_buffered_norm2: read the gradient, write 8 bytes, read them back, in chunks of at most
#   NORM_CHUNK_ELEMENTS). A chunk's float64 copy larger than FRESH_ALLOCATION_BYTES is fresh memory (glibc maps it
#   and unmaps it when freed): its write is priced at the first-touch rate, the rest at the copy rate. Until
#   2026-11-29 every copy was priced as mapped memory: gpt2-1.3b's norms (each of its matrices above 4 Mi elements)
#   took 4.66 s of a 29 s step (scripts/step_phases.py) where the model had 0.83 s. On this machine a norm takes
#   3.3-4.0 ns an element above the threshold and 0.9 below it (2.4 M elements, as gpt2-small's layers); the machine
#   file's rates price the first at 2.4 ns, the second at 0.65.
# Priced at the host-copy rate, not fitted. On a GPU these passes run in device memory and are left out.
EPILOGUE_GATHERED_PASSES = 5
EPILOGUE_PARTITION_PASSES = 4
# Where the partition group is one rank on a host accelerator, tencache hands stage 3 views of the gradients for their
# reduce-scatter (integrations/deepspeed/one_rank_reduce.py): no new flat buffer (the read of the bucket that fills
# it: 1 pass), no pre-divide over it (2), no reduce-scatter copy into its output (2 over the partition, which at one
# rank is the gradient); and since 2026-12-05 no copy into the reduce bucket either (2: each gradient is partitioned
# at once), so none of the gathered passes is left. Of the 2.5 fresh bytes per gathered byte above, two buffers of the
# gathered size are left out: the flat buffer, and the one gloo writes for ``reduce_scatter_tensor`` at one rank.
# Measured as page faults (scripts/count_fresh_memory.py, gpt2-small fp32 micro-batch 2 x 64, 2026-12-01): stock's
# backward 1246 MiB beside the norms, tencache's 295, 474 MiB gathered: 2.63 and 0.62 per gathered byte. Until then
# 1.0 (the flat buffer alone; docs/estimate.md, Run 21).
ONE_RANK_VIEWS_FRESH_BYTES_PER_GATHERED_BYTE = 2.0
ONE_RANK_VIEWS_GATHERED_PASSES = 5
ONE_RANK_VIEWS_PARTITION_PASSES = 2
EPILOGUE_ACCUMULATE_EXTRA_PASSES = 1
NORM_FLOAT64_BYTES = 16
NORM_COPY_ELEMENT_BYTES = 8  # the float64 copy's element
NORM_CHUNK_ELEMENTS = 250_000_000  # _constant_buffered_norm2's buffer_size (DeepSpeed 0.19.8)
# glibc serves an allocation larger than this from a new mapping (the ceiling of its dynamic mmap threshold on
# 64-bit, DEFAULT_MMAP_THRESHOLD_MAX) and unmaps it when freed, so its pages fault in at every use; smaller ones reuse
# the heap. One of exactly this size takes free heap first when there is any: gpt2-medium's 4 Mi-element matrices
# (float64 copies of 32 MiB, 1536 MiB in all) faulted 27 to 1098 MiB a step, so they count as mapped.
FRESH_ALLOCATION_BYTES = 32 * 1024**2
# tencache's clipping norms copy into one reused buffer of at most this many bytes (integrations/deepspeed/
# gradient_norms.py); a larger copy is made fresh, as DeepSpeed makes it. So the buffer adds at most this to the
# backward's memory over stock's, and what it leaves fresh is the rare very large partition (on gpt2-1.3b its 65.5
# M-element embedding, 0.5 GB of faults a step, against 9 GiB for the 96 layer matrices it serves).
NORM_SCRATCH_MAX_BYTES = 256 * 1024**2
# What a process keeps in its heap beside its tensors, per element of the parameters it serves, where stage 3 reduces
# the gradients itself (``heap_kept_bytes``; where tencache hands that reduce views, the gradients' element bytes):
# the figure the largest sub-group's initialisation term had with fp32 masters, inside the 8-14 B measured (fp32
# runs; with bf16 masters, where that term was 6 B, nothing has been measured)
HEAP_KEPT_BYTES_PER_ELEMENT = 10


def optimizer_state_bytes_per_element(zero: ZeroSettings) -> int:
    """The master and the optimizer's state, per element, in their dtypes (fp32 Adam: 12, Adagrad: 8)."""
    return zero.precision.master_bytes + len(zero.precision.state_names) * zero.precision.state_bytes


def sub_group_file_bytes(zero: ZeroSettings, numel: int) -> Dict[str, int]:
    """One sub-group's swap files by tensor (aligned as DeepSpeed aligns them): the master and the gradient in the
    masters' dtype, each state tensor (``precision.state_names``: Adam's "exp_avg" and "exp_avg_sq") in the
    state's."""
    master = zero.swap_nbytes(numel, zero.precision.master_bytes)
    state = zero.swap_nbytes(numel, zero.precision.state_bytes)
    return {"master": master, **{name: state for name in zero.precision.state_names}, "gradient": master}


def module_compute_s(fetch, rates: Rates) -> float:
    """One use of a submodule on the compute thread: its FLOPs at the machine's rate, and ZeRO-3's hooks around it
    where the machine file measures them."""
    return fetch.flops / rates.flops_per_s + rates.module_call_s


def optimizer_cpu_s(workload: Workload, elements: int, rates: Rates) -> float:
    """CPU Adam and the step's epilogue over ``elements`` (host optimizer only)."""
    return elements / rates.adam_elements_per_s + elements * EPILOGUE_BYTES_PER_ELEMENT / rates.host_copy_bytes_per_s


def optimizer_cpu_seconds(workload: Workload, machine: Machine) -> float:
    """The step's CPU Adam and epilogue on this machine (host optimizer; 0 without optimizer offload)."""
    if workload.zero.offload_optimizer == "none":
        return 0.0
    return optimizer_cpu_s(workload, workload.rank_elements, channel_rates(machine, arena_buffers=True))


def one_rank_on_a_host_accelerator(workload: Workload, machine: Machine) -> bool:
    """One rank on DeepSpeed's CPU accelerator: a gather is the partition itself (tencache.py
    ``gathers_alias_partitions``) and a reduce-scatter has nothing to exchange (``reduces_to_views``)."""
    return machine.accelerator_is_host and workload.world_size == 1


def deepspeed_pins(machine: Machine) -> bool:
    """Is what stage 3 pins through the accelerator (``get_accelerator().pin_memory``: its gradient buffer with the
    optimizer's ``pin_memory``, partitions kept off NVMe) pinned memory on this machine? Not on a host accelerator:
    DeepSpeed 0.19.8's CPU accelerator returns the tensor unpinned (unless ``DS_PIN_MEMORY_BACKEND`` is "native"),
    so the same bytes are pageable there. Not the swap buffers: the aio handle locks those itself
    (``new_cpu_locked_tensor``) on any accelerator. tencache's own parameter slots are locked by its own rule
    (plan/budget.parameter_lock_mode)."""
    return not machine.accelerator_is_host


def reduces_to_views(workload: Workload, machine: Machine) -> bool:
    """Does tencache hand stage 3's reduce-scatter views of the gradients (one_rank_reduce.reduces_to_views): one
    rank in the partition group, on a host accelerator? ``reduce_scatter`` is taken as on, DeepSpeed's default, as
    the epilogue's passes above take it."""
    return one_rank_on_a_host_accelerator(workload, machine)


# The largest partition group whose gradients tencache partitions at once on a host accelerator, without stage 3's
# contiguous bucket (integrations/deepspeed/one_rank_reduce.py, AT_ONCE_MAX_GROUP_RANKS: the same number, checked by
# tests/deepspeed/test_one_rank_reduce.py)
AT_ONCE_MAX_GROUP_RANKS = 2


def partitions_gradients_at_once(workload: Workload, machine: Machine) -> bool:
    """Does tencache partition each gradient as its hook hands it over, so that stage 3's contiguous reduce bucket
    is never written (one_rank_reduce.partitioning_each_gradient_at_once): on a host accelerator, at most
    ``AT_ONCE_MAX_GROUP_RANKS`` ranks in the partition group. At one rank its reduce also takes views
    (``reduces_to_views``); at two it is DeepSpeed's reduce of one gradient at a time."""
    return machine.accelerator_is_host and workload.world_size <= AT_ONCE_MAX_GROUP_RANKS


def backward_host_memory_s(workload: Workload, machine: Machine, micro: int, reduce_views: bool = False,
                           norms_reuse_memory: bool = False) -> float:
    """Host memory work of micro-batch ``micro``'s backward on a host accelerator, beyond its FLOPs: the fresh
    memory it writes (page faults; without the machine's figure, left out) and stage 3's gradient epilogue's
    passes over memory already mapped. 0 on a GPU, where that memory is the device's. ``reduce_views``: the
    reduce-scatter is handed views (``reduces_to_views``), without its buffer and its passes. ``norms_reuse_memory``:
    the clipping norms' float64 copies go into one reused buffer (tencache: ``norm_fresh_elements``)."""
    if not machine.accelerator_is_host:
        return 0.0
    elem = workload.zero.element_bytes
    gathered = gathered_elements(workload)
    fresh_rate = machine.host_fresh_write_bytes_per_s_per_rank
    fresh_per_gathered = BACKWARD_FRESH_BYTES_PER_GATHERED_BYTE - \
        (ONE_RANK_VIEWS_FRESH_BYTES_PER_GATHERED_BYTE if reduce_views else 0)
    fresh_bytes = gathered * elem * fresh_per_gathered
    partition_passes = EPILOGUE_PARTITION_PASSES + (EPILOGUE_ACCUMULATE_EXTRA_PASSES if micro > 0 else 0) - \
        (ONE_RANK_VIEWS_PARTITION_PASSES if reduce_views else 0)
    gathered_passes = EPILOGUE_GATHERED_PASSES - (ONE_RANK_VIEWS_GATHERED_PASSES if reduce_views else 0)
    passes_bytes = (gathered * gathered_passes + workload.rank_elements * partition_passes) * elem
    if micro == workload.gas - 1:
        norm_fresh = norm_fresh_elements(workload, norms_reuse_memory) * NORM_COPY_ELEMENT_BYTES if fresh_rate else 0
        fresh_bytes += norm_fresh
        passes_bytes += workload.rank_elements * (elem + NORM_FLOAT64_BYTES) - norm_fresh
    fresh_s = fresh_bytes / fresh_rate if fresh_rate else 0.0
    return fresh_s + passes_bytes / machine.host_copy_bytes_per_s_per_rank


def norm_fresh_elements(workload: Workload, reused: bool = False) -> int:
    """The rank's gradient elements whose float64 copy for the clipping norm is fresh memory: the chunks
    (``NORM_CHUNK_ELEMENTS``) of each gradient partition whose copy is larger than ``FRESH_ALLOCATION_BYTES``. E.g.
    gpt2-small at one rank: its 38.6 M-element embedding (294.5 MiB of float64, 294-312 MiB of faults measured), not
    its layers' 2.4 M-element matrices. ``reused``: the copies up to ``NORM_SCRATCH_MAX_BYTES`` share one buffer,
    fresh once a step (it is let go at the update) where it is a mapping of its own; larger ones are fresh each."""
    chunks = []
    for partition in workload.partitions.values():
        whole, rest = divmod(partition.part_numel, NORM_CHUNK_ELEMENTS)
        chunks += [NORM_CHUNK_ELEMENTS] * whole + ([rest] if rest else [])

    def fresh_copy(elements: int) -> bool:
        return elements * NORM_COPY_ELEMENT_BYTES > FRESH_ALLOCATION_BYTES

    if not reused:
        return sum(chunk for chunk in chunks if fresh_copy(chunk))
    above = [chunk for chunk in chunks if chunk * NORM_COPY_ELEMENT_BYTES > NORM_SCRATCH_MAX_BYTES]
    buffer = max((chunk for chunk in chunks if chunk * NORM_COPY_ELEMENT_BYTES <= NORM_SCRATCH_MAX_BYTES), default=0)
    return sum(above) + (buffer if fresh_copy(buffer) else 0)


def allgather_s(workload: Workload, machine: Machine, keys) -> float:
    """Stage 3's all-gather of ``keys``' partitions at one fetch: the bytes a rank receives from the others (each of
    them sends its partition) at the machine's all-gather rate. 0 at one rank, or without the machine's figure."""
    if workload.world_size <= 1 or not machine.allgather_bytes_per_s:
        return 0.0
    received = sum(workload.partitions[key].part_numel for key in keys) * (workload.world_size - 1)
    return received * workload.zero.element_bytes / machine.allgather_bytes_per_s


def persistent_keys(workload: Workload):
    """The parameters stage 3 keeps gathered for good (``stage3_param_persistence_threshold``): after every
    optimizer step it all-gathers them again, updated (``_post_step``); no fetch gathers them."""
    return [key for key, partition in workload.partitions.items() if partition.persistent]


def reduce_scatter_s(workload: Workload, machine: Machine) -> float:
    """A micro-batch's reduce-scatter of the whole model's gradients (stage 3 reduces every micro-batch): each rank
    receives the others' share of its partition and adds it. Only the collective: the bucket's copies around it are
    the epilogue's passes (``backward_host_memory_s``). 0 at one rank, or without the machine's figure."""
    if workload.world_size <= 1 or not machine.reduce_scatter_bytes_per_s:
        return 0.0
    received = workload.rank_elements * (workload.world_size - 1)
    return received * workload.zero.comm_element_bytes / machine.reduce_scatter_bytes_per_s


def param_bytes(workload: Workload, key: str) -> int:
    return workload.zero.swap_nbytes(workload.partitions[key].part_numel)


def gathered_bytes(workload: Workload, key: str) -> int:
    return workload.partitions[key].numel * workload.zero.element_bytes


def gathered_elements(workload: Workload) -> int:
    """The model's elements, gathered: what a backward's gradients fill before stage 3 reduces them."""
    return sum(p.numel for p in workload.partitions.values())


def reduce_bucket_fill(workload: Workload) -> int:
    """The elements of the gradient reduce bucket a backward fills: ``reduce_bucket_size``, or the gathered model's
    when it is smaller."""
    return min(workload.zero.reduce_bucket_size, gathered_elements(workload))


def _activation_bytes(workload: Workload) -> int:
    return workload.shape.activation_bytes(workload.micro_batch, workload.seq_len, workload.checkpointing,
                                           workload.zero.element_bytes)


def device_working_bytes(workload: Workload, host_accelerator: bool, reduce_views: bool = False,
                         bucket_unused: Optional[bool] = None) -> int:
    """Accelerator memory ZeRO-3 needs besides a device tier: what a step allocates and frees
    (``device_step_bytes``), the gradient reduce bucket (``reduce_bucket_bytes``: allocated at initialisation and
    resident between steps once a backward has filled it; with ``bucket_unused`` (default: ``reduce_views``) on a
    host accelerator never written, so never resident: each gradient is partitioned at once,
    ``partitions_gradients_at_once``), persistent parameters, and model states not offloaded."""
    bucket_unused = reduce_views if bucket_unused is None else bucket_unused
    zero, elem = workload.zero, workload.zero.element_bytes
    persistent = sum(p.numel for p in workload.partitions.values() if p.persistent) * elem
    not_offloaded = 0
    if zero.offload_param == "none":
        not_offloaded += workload.rank_elements * elem
    if zero.offload_optimizer == "none":
        not_offloaded += workload.rank_elements * (optimizer_state_bytes_per_element(zero)
                                                   + zero.precision.master_bytes)  # and the gradient
    bucket = 0 if bucket_unused and host_accelerator else reduce_bucket_bytes(workload, host_accelerator)
    return device_step_bytes(workload, host_accelerator) + bucket + persistent + not_offloaded


def device_step_bytes(workload: Workload, host_accelerator: bool, reduce_views: bool = False) -> int:
    """The part of ``device_working_bytes`` that a step needs beyond what lies between steps (the gradient bucket
    among it), the larger of two moments:

    - forward and backward: the gathered module and the one prefetched after it, the prefetch bucket, and
      activations;
    - a reduce of the gradient bucket (plan/memory_pressure.py ``stage3_rise_prior``, the run-time governor's
      prior): on a host accelerator the bucket's fill twice (stage 3 concatenates it and reduces it into another
      buffer; on a GPU once, the model's figure before 2026-11-29, which no GPU run has checked), and, where the
      bucket fills before the backward ends, the two gathered modules around it.

    ``reduce_views``: the reduce is handed views of the bucket (``reduces_to_views``: tencache at one rank on a host
    accelerator, integrations/deepspeed/one_rank_reduce.py), and takes no memory of its own: the first moment
    alone. gpt2-1.3b then rose 0.44-0.52 GiB a step (this gives 0.79 GiB); with the reduce's buffers it rose 4 GiB.
    What a step rises is still the reduce's for the governor's reserve (``host_step_rise_bytes``), which keeps
    counting them (plan/memory_pressure.py ``kept_rise_bytes``); this is what the step holds.

    Until 2026-11-29 (twenty-fourth session) the bucket was counted here, in the step, and not between steps: on
    a host accelerator, where the first backward makes it resident and it stays (gpt2-1.3b's first backward rose
    5.9 GiB, each later one 4.0), the model's peak was short of it.
    """
    zero, elem = workload.zero, workload.zero.element_bytes
    largest_module = _largest_module_bytes(workload)
    working = 2 * largest_module + zero.prefetch_bucket_size * elem + _activation_bytes(workload)
    if reduce_views and host_accelerator:
        return working
    fill = reduce_bucket_bytes(workload, host_accelerator=True)
    reducing = run_time_prior(workload, host_accelerator=True, update=False).rise_bytes - \
        (0 if host_accelerator else fill)
    return max(working, reducing)


def run_time_prior(workload: Workload, host_accelerator: bool, update: bool = True) -> RisePrior:
    """What the run-time governor takes as a step's rise before one is measured (plan/memory_pressure.py
    ``stage3_rise_prior``; integrations/deepspeed/memory_pressure.py ``stage3_prior`` reads the same facts from
    stage 3, with the largest parameter for the largest module, which it cannot see), from this workload; without
    ``update``, the reduce moment alone. Activations are not in it: the run knows none before a step."""
    # the bucket's element size, as the run reads it (integrations/deepspeed/memory_pressure.py stage3_prior)
    zero, elem = workload.zero, workload.zero.comm_element_bytes
    return stage3_rise_prior(host_accelerator, gathered_elements(workload) * elem, zero.reduce_bucket_size * elem,
                             bucket_allocated=True, around_bytes=_largest_module_bytes(workload),
                             largest_sub_group_bytes=workload.largest_sub_group_elements * 4 if update else 0)


def _largest_module_bytes(workload: Workload) -> int:
    return max((sum(gathered_bytes(workload, key) for key in fetch.keys) for fetch in workload.fetches), default=0)


def reduce_bucket_bytes(workload: Workload, host_accelerator: bool) -> int:
    """Stage 3's gradient reduce bucket: ``reduce_bucket_size`` elements that initialisation allocates whole on the
    accelerator (``ipg_buckets``, DeepSpeed 0.19.8). A backward fills it with gathered gradients, not yet reduced,
    so on a host accelerator, where memory never written takes no pages, as much of it is resident as the gathered
    model's gradients fill, at any number of ranks (the model counted it at the rank's partition until 2026-11-27:
    at 2 ranks half of it). In ``communication_data_type``'s element size, as stage 3 allocates it."""
    zero = workload.zero
    elements = reduce_bucket_fill(workload) if host_accelerator else zero.reduce_bucket_size
    return elements * zero.comm_element_bytes


def host_step_rise_bytes(workload: Workload, machine: Machine) -> int:
    """How far a rank's host memory rises during a step above its level between steps: what the host-tier governor
    measures (memory/footprint.py) and sizes its reserve by (plan/memory_pressure.py). tencache at one or two ranks on
    a host accelerator rises less (its reduce takes none of the bucket's buffers:
    integrations/deepspeed/one_rank_reduce.py) and its reserve keeps counting them (``kept_rise_bytes``): this is what
    that reserve counts, for both policies.

    - the optimizer update's temporaries: taken as one fp32 tensor of the largest sub-group. An assumption, not a
      measurement: no GPU run has measured a step's host rise; on a GPU it is the whole estimate.
    - on a host accelerator, also what the device would hold during forward and backward or a reduce of the
      gradient bucket (``device_step_bytes``); the larger of the two counts, since the update starts after
      backward has freed its working set. Measured (docs/bench, fp32, micro-batch 1 x 32, the
      host_step_rise_bytes of the metrics): gpt2-small with stage 3's defaults rose 995.5 MB a step at 1 rank and
      996-1001 MB at 2 (GAS 4), this gives 995.5 MB (1041 MB before the bucket was counted between steps);
      gpt2-1.3b 3.97 GiB, this gives 4.21 GiB.
    """
    update = workload.largest_sub_group_elements * 4
    if not machine.accelerator_is_host:
        return update
    return max(update, device_step_bytes(workload, host_accelerator=True))


def nvme_space(workload: Workload, gradient_files: bool) -> int:
    """The swap files of one rank: parameter partitions on NVMe and, with the optimizer there, every sub-group's
    master and state tensors, and its gradient where ``gradient_files`` (stock writes each one in backward; tencache
    reads them from stage 3's own buffer at the update, and writes one only for a gradient stage 3 holds no host
    copy of: not counted)."""
    zero = workload.zero
    space = sum(param_bytes(workload, key) for key, p in workload.partitions.items() if p.on_nvme)
    if zero.offload_optimizer == "nvme":
        for i in range(len(workload.sub_groups)):
            files = sub_group_file_bytes(zero, workload.sub_group_elements(i))
            space += sum(nbytes for tensor, nbytes in files.items() if gradient_files or tensor != "gradient")
    return space


def heap_is_kept(machine: Machine, reduce_views: bool) -> bool:
    """Does the process keep stock's heap beside its tensors (``heap_kept_bytes`` at ``HEAP_KEPT_BYTES_PER_ELEMENT``)
    in place of the initialisation's buffers: on a host accelerator, where stage 3 reduces the gradients itself.
    Not where tencache hands that reduce views (``reduce_views``: one rank on a host accelerator), whose smaller
    heap (the gradients' bytes) is priced beside those buffers' start-up term, nor on a GPU: there the
    initialisation's buffers (``init_outside_pool_bytes``) stand, as before."""
    return machine.accelerator_is_host and not reduce_views


def heap_kept_bytes(workload: Workload, machine: Machine, *, reduce_views: bool) -> int:
    """What a training process keeps beside its tensors on a host accelerator, per element of the parameters whose
    tensors glibc serves from its heap (at most ``FRESH_ALLOCATION_BYTES`` in their largest dtype; larger ones are
    mapped and unmapped). Every backward allocates and frees each such parameter's gradient there, stage 3's reduce
    its copies, and the heap keeps its high-water mark; the same at any number of ranks and sub-groups: where stage 3
    reduces the gradients itself (``heap_is_kept``) ``HEAP_KEPT_BYTES_PER_ELEMENT``, e.g. gpt2-small in fp32: 86 M
    elements outside its embedding, 0.80 GiB. It replaces the largest sub-group's initialisation term
    (``init_outside_pool_bytes``) there; without optimizer offload, which had no such term, it is an addition that
    no run has measured. Where tencache hands that reduce views (``reduce_views``), the gradients alone: their
    element bytes (gpt2-small fp32: 0.32 GiB), beside initialisation's term (not kept by then). 0 on a GPU.

    Measured as peak RSS less the model's other terms (scripts/measure_host_rest.py, fp32, micro-batch 1 x 32,
    2026-11-30; docs/estimate.md, "Host memory beside the tensors"): stock CPU offload with DeepSpeed's defaults
    kept 0.96 and 1.01 GiB on gpt2-small at one rank with 1 and 37 sub-groups, 1.13 and 1.08 GiB at two (12-14 B
    an element), 2.2 GiB on gpt2-medium with 178 sub-groups (303 M elements: 8 B); gpt2-1.3b's stock NVMe rows,
    whose large matrices are mapped, about 0.4 GiB (103 M: 4 B). tencache at one rank, whose reduce takes views,
    kept 0.05-0.39 GiB on gpt2-small and 0.76 GiB on gpt2-medium (37 and 178 sub-groups), unpriced until
    2026-12-04; then, sampled every 2 ms through the first steps (one sub-group, 2 x 64; docs/estimate.md, "The
    first update's memory"), 0.25-0.34 GiB on gpt2-small and 1.43 GiB on gpt2-medium above the model's other terms
    when the first update starts, and 0.2 and 0.5-0.95 GiB at the steady steps' peaks. The initialisation term it
    replaces for stock shrank with sub-groups and ranks, and the peaks do not (stock CPU offload on gpt2-small: 5.07
    and 5.12 GiB at one rank with 1 and 37 sub-groups, 4.08 and 4.03 at two)."""
    if not machine.accelerator_is_host:
        return 0
    zero = workload.zero
    elem = max(zero.element_bytes, zero.precision.master_bytes)
    per_element = zero.element_bytes if reduce_views else HEAP_KEPT_BYTES_PER_ELEMENT
    return per_element * sum(p.numel for p in workload.partitions.values() if p.numel * elem <= FRESH_ALLOCATION_BYTES)


def host_resident_bytes(workload: Workload, machine: Machine, *, reduce_views: bool,
                        bucket_unused: Optional[bool] = None) -> Dict[str, int]:
    """Host-side bytes every policy has: the process, the heap it keeps (``heap_kept_bytes``; ``reduce_views``:
    tencache's reduce takes views), stage 3's gradient partitions, and (on the CPU accelerator) what would be
    device memory (``bucket_unused``: device_working_bytes)."""
    device = device_working_bytes(workload, machine.accelerator_is_host, reduce_views=reduce_views,
                                  bucket_unused=bucket_unused)
    return {"baseline": machine.process_baseline_bytes,
            "heap": heap_kept_bytes(workload, machine, reduce_views=reduce_views),
            # stage 3's gradient partitions (grad_partitions_flat_buffer), in the gradient accumulation dtype
            "gradients": workload.rank_elements * workload.zero.grad_accum_bytes,
            "device_on_host": device if machine.accelerator_is_host else 0,
            "device": 0 if machine.accelerator_is_host else device}
