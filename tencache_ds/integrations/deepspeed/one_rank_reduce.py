"""Stage 3's gradient reduce-scatter where the partition group is one rank: the values it would copy, not a copy;
and each gradient of a group of one or two ranks partitioned as soon as it is ready, not first copied into stage 3's
contiguous bucket.
Owns: which calls take those paths, and the paths themselves. Does not own: what stage 3 does with the partitions
after (partition_grads, stage3_gradients.py).

What DeepSpeed 0.19.8 does for every bucket of reduced gradients (stage3.py ``__avg_scatter_grads`` ->
``runtime/comm/coalesced_collectives.reduce_scatter_coalesced``), at a group of one rank as at any other:

- the bucket's gradients are concatenated into a new flat buffer (``torch.cat``; with one tensor, that tensor
  itself), padded to a multiple of the group's size (at one rank, no padding);
- the buffer is divided in place by the group's size (``div_(1)``);
- ``reduce_scatter_tensor`` reduces it into its own first chunk (at one rank: the whole buffer, onto itself);
- the result is a list of views of that buffer, one per gradient, each the gradient's length.

At one rank each view holds the gradient's own values (x / 1 is x, in every dtype), so the views of the gradients
themselves are the same list without the work: on a host accelerator the concatenation is fresh memory the size of
the bucket (``reduce_bucket_size``, 2 GB with DeepSpeed's defaults in fp32), and gloo's reduce writes another fresh
buffer of its size and copies through it (plan/step_model/costs.py, ONE_RANK_VIEWS_FRESH_BYTES_PER_GATHERED_BYTE).
gpt2-small, fp32, one rank, tencache ``"auto"``: 2.36 s a step with stock's path, 1.545 s with views (medians, 2 runs
each, a wrapper doing what this module does; docs/benchmarks.md), the same weights. Stage 3 already takes
views of its input in the one-tensor case: every caller only reads the result (``partition_grads`` copies or adds it
into its gradient partitions, before the bucket is filled again: contract.py, CALL_ORDER).

**The contiguous bucket, at one rank and at two.** Before that reduce, stage 3 copies each gradient autograd
produced into its bucket (``__add_grad_to_ipg_bucket``, ``contiguous_gradients`` on, DeepSpeed's default), a buffer
of ``reduce_bucket_size`` elements allocated at initialisation, and reduces the bucket once it is full. With
``reduce_scatter`` on, nothing reads the bucket as one buffer: ``__avg_scatter_grads`` reads each parameter's
``grad``, which the copy made a view of the bucket. So where that reduce is handed views, the copy moves the same
values into a buffer of their own for nothing: a pass over every gradient, and on a host accelerator the bucket's
pages, which memory takes only where written, resident for good from the first backward (2 GB with DeepSpeed's
defaults in fp32; gpt2-1.3b, fp32, ``"auto"``: peak RSS 17.8 GiB with the copy, 16.1 without,
docs/bench/gradients-at-once-2026-12-05). There each
gradient is partitioned as soon as its hook hands it over, as a bucket of one: stage 3's own path for a gradient
larger than the bucket (left where autograd put it, ``contiguous_gradients`` off), and with its own flush
(``__reduce_and_partition_ipg_grads``), which frees the gradient at once. The values partition_grads copies or adds
are the gradient's own either way, and each is copied or added on its own, so when a bucket is reduced does not
change them; the copy's cast into the bucket's dtype is made all the same where it changes a value:
``__avg_scatter_grads`` casts each gradient to the communication dtype where that is not the model's, and a gradient
of another dtype beside a communication dtype that is the model's keeps DeepSpeed's path. (A parameter whose hook
fires twice in one backward is partitioned twice, the second copy over the first, as stock does where a flush comes
between the two; where both land in one of stock's buckets, stock stops at its assertion that a bucket holds each
parameter once.)

At two ranks the same holds, with DeepSpeed's own reduce: ``reduce_scatter_coalesced`` of one gradient concatenates
nothing (unless it pads an odd length: then a buffer of that gradient's size, not the bucket's), divides it in place
and reduce-scatters it, so what each rank's partition receives is, element by element, the sum of the two ranks'
values divided by two, as from the bucket (a sum of two values has one result in any order; beyond two ranks the
bucket's path is kept: ``AT_ONCE_MAX_GROUP_RANKS``). What it saves is the bucket's pages and the concatenation's:
gpt2-1.3b beyond RAM at two ranks peaked at 20.85 GiB on the node in its first step with the bucket and 15.40 without
(docs/reliability.md, "Two ranks beyond RAM"). Each gradient is then one collective call instead of one a bucket,
so both ranks must hand their gradients over in the same order (stock sorts a bucket by ``ds_id`` and is indifferent
within one): autograd's order is the same on both, for the same model and inputs' shapes, and DeepSpeed's
``enable_sanity_checks`` compares the ids of each reduce.

Only where the accelerator is host memory (ordered by construction: one thread, no streams; on a GPU the copies run
on ``reduce_and_partition_stream`` and the argument that the bucket is not refilled before they are done would
rest on stage 3's stream waits, not checked on a GPU here), and only for optimizers tencache swaps for (the host
governor is attached: reporting.attach_step_meter): a stock engine in the same process keeps DeepSpeed's path.
"""
import contextvars
import functools

import deepspeed.comm as dist

from .config_bridge import accelerator_is_host
from .memory_pressure import governor_of

# the tencache optimizer on a host accelerator whose __avg_scatter_grads runs: its reduce-scatter may skip the copy
_REDUCING_FOR = contextvars.ContextVar("tencache_reducing_for", default=None)
COUNT_ATTRIBUTE = "_tencache_reductions_without_copy"  # on the ZeRO-3 optimizer: SUM of calls that took the views
# on the ZeRO-3 optimizer: SUM of gradients partitioned at once, without the bucket's copy
AT_ONCE_ATTRIBUTE = "_tencache_gradients_partitioned_at_once"
# The largest partition group whose gradients are partitioned at once: there each reduced element is the sum of at
# most two values (each already divided by the group's size), which no order of the reduce can change, so reducing a
# gradient alone gives the bucket's bits. With more ranks the summation order is gloo's, and may depend on the length
# of what it reduces.
AT_ONCE_MAX_GROUP_RANKS = 2


def reductions_without_copy(optimizer) -> int:
    return getattr(optimizer, COUNT_ATTRIBUTE, 0)


def gradients_partitioned_at_once(optimizer) -> int:
    return getattr(optimizer, AT_ONCE_ATTRIBUTE, 0)


def reduces_to_views(stage3) -> bool:
    """Will a built ZeRO-3 optimizer's gradient reduces be handed views (once tencache swaps for it): on a host
    accelerator, with ``reduce_scatter`` on (off, stage 3 all-reduces its contiguous bucket instead and calls
    ``reduce_scatter_coalesced`` only for a bucket over its size), every parameter's partition group of one rank.
    The step model's mirror: plan/step_model/costs.py ``reduces_to_views``."""
    return _largest_partition_group(stage3) == 1


def partitions_each_gradient_at_once(stage3) -> bool:
    """Will a built ZeRO-3 optimizer's gradients all be partitioned at once, its bucket never written (once tencache
    swaps for it): as ``reduces_to_views``, with partition groups of up to ``AT_ONCE_MAX_GROUP_RANKS`` ranks. The
    step model's mirror: plan/step_model/costs.py ``partitions_gradients_at_once``."""
    return 0 < _largest_partition_group(stage3) <= AT_ONCE_MAX_GROUP_RANKS


def _largest_partition_group(stage3) -> int:
    """The most ranks any parameter's gradient is reduce-scattered over where tencache could take that reduce (a
    host accelerator, ``reduce_scatter`` on); 0 where it cannot, or there are no parameters."""
    if not accelerator_is_host() or not stage3.reduce_scatter:
        return 0
    groups = {id(group): group for group in (stage3._get_param_partition_group(param)
                                             for params in stage3.fp16_groups for param in params)}
    return max((dist.get_world_size(group) for group in groups.values()), default=0)


def _reduces_for_tencache(stage3) -> bool:
    """Does this module take this optimizer's gradients (partitioned at once) and reduce-scatters (marked for views:
    ``marking_tencache_reductions``): a tencache optimizer on a host accelerator with ``reduce_scatter`` on. The group
    of each gradient or call (one rank for views, at most ``AT_ONCE_MAX_GROUP_RANKS`` at once) is checked where it is
    handed over."""
    return governor_of(stage3) is not None and accelerator_is_host() and stage3.reduce_scatter


def partitioning_each_gradient_at_once(add_grad_to_ipg_bucket):
    """Wraps stage 3's ``__add_grad_to_ipg_bucket``: for a tencache optimizer on a host accelerator
    (``_reduces_for_tencache``), a gradient whose partition group has at most ``AT_ONCE_MAX_GROUP_RANKS`` ranks is
    not copied into the contiguous bucket but reduced and partitioned at once, alone (the module's docstring says
    why that leaves the values as they are). ZenFlow's bucket copy (transposed, for its channel selection) is left to
    DeepSpeed, as is every other gradient."""
    @functools.wraps(add_grad_to_ipg_bucket)
    def add_grad_partitioned_at_once(self, param):
        # ZenFlow's prologue sets its flag from its own module (zenflow/engine_stage3.py), which contract.py's check
        # of stage 3's source cannot see: read with a default
        if not _reduces_for_tencache(self) or getattr(self, "zenflow", False):
            return add_grad_to_ipg_bucket(self, param)
        group = self._get_param_partition_group(param)
        if dist.get_world_size(group) > AT_ONCE_MAX_GROUP_RANKS:
            return add_grad_to_ipg_bucket(self, param)
        comm_dtype = self.get_param_comm_dtype(param)
        if param.grad.dtype != comm_dtype and comm_dtype == self.dtype:
            # the bucket's copy would cast it and __avg_scatter_grads would not: DeepSpeed's path
            return add_grad_to_ipg_bucket(self, param)
        bucket = self.ipg_buckets[comm_dtype]
        # what DeepSpeed's add does beside the copy; the caller has reduced a bucket of another group already
        bucket.params.append(param)
        bucket.process_group = group
        bucket.elements += param.grad.numel()
        setattr(self, AT_ONCE_ATTRIBUTE, gradients_partitioned_at_once(self) + 1)
        self._DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads(comm_dtype)

    return add_grad_partitioned_at_once


def marking_tencache_reductions(avg_scatter_grads):
    """Wraps stage 3's ``__avg_scatter_grads``: its call of ``reduce_scatter_coalesced`` is marked as one for a
    tencache optimizer on a host accelerator with ``reduce_scatter`` on."""
    @functools.wraps(avg_scatter_grads)
    def avg_scatter_grads_marked(self, *args, **kwargs):
        # a stock optimizer's call clears the mark too: one called from inside a tencache one's is not taken for it.
        # Without reduce_scatter, stage 3 comes here only for a bucket over its size: left to DeepSpeed, as
        # reduces_to_views (and so the governor's reserve) has it
        token = _REDUCING_FOR.set(self if _reduces_for_tencache(self) else None)
        try:
            return avg_scatter_grads(self, *args, **kwargs)
        finally:
            _REDUCING_FOR.reset(token)

    return avg_scatter_grads_marked


def reducing_without_copy_at_one_rank(reduce_scatter_coalesced):
    """Replaces stage 3's module-global ``reduce_scatter_coalesced``: for a marked call over a group of one rank,
    one flat view of each gradient (what DeepSpeed's returns, without the new buffer); every other call goes to
    DeepSpeed's own function."""
    @functools.wraps(reduce_scatter_coalesced)
    def reduce_scatter_coalesced_at_one_rank(tensors, group=None):
        optimizer = _REDUCING_FOR.get()
        if optimizer is None or dist.get_world_size(group) != 1:
            return reduce_scatter_coalesced(tensors, group)
        setattr(optimizer, COUNT_ATTRIBUTE, reductions_without_copy(optimizer) + 1)
        return [tensor.view(-1) for tensor in tensors]

    return reduce_scatter_coalesced_at_one_rank


__all__ = ["gradients_partitioned_at_once", "marking_tencache_reductions", "partitioning_each_gradient_at_once",
           "partitions_each_gradient_at_once", "reduces_to_views", "reducing_without_copy_at_one_rank",
           "reductions_without_copy"]
