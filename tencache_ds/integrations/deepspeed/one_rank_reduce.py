"""Stage 3's gradient reduce-scatter where the partition group is one rank: the values it would copy, not a copy.
Owns: which calls take that path, and the path itself. Does not own: what stage 3 does with the partitions after
(partition_grads, stage3_gradients.py).

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


def reductions_without_copy(optimizer) -> int:
    return getattr(optimizer, COUNT_ATTRIBUTE, 0)


def reduces_to_views(stage3) -> bool:
    """Will a built ZeRO-3 optimizer's gradient reduces be handed views (once tencache swaps for it): on a host
    accelerator, with ``reduce_scatter`` on (off, stage 3 all-reduces its contiguous bucket instead and calls
    ``reduce_scatter_coalesced`` only for a bucket over its size), every parameter's partition group of one rank.
    The step model's mirror: plan/step_model/costs.py ``reduces_to_views``."""
    if not accelerator_is_host() or not stage3.reduce_scatter:
        return False
    groups = {id(group): group for group in (stage3._get_param_partition_group(param)
                                             for params in stage3.fp16_groups for param in params)}
    return bool(groups) and all(dist.get_world_size(group) == 1 for group in groups.values())


def marking_tencache_reductions(avg_scatter_grads):
    """Wraps stage 3's ``__avg_scatter_grads``: its call of ``reduce_scatter_coalesced`` is marked as one for a
    tencache optimizer on a host accelerator with ``reduce_scatter`` on."""
    @functools.wraps(avg_scatter_grads)
    def avg_scatter_grads_marked(self, *args, **kwargs):
        # a stock optimizer's call clears the mark too: one called from inside a tencache one's is not taken for it.
        # Without reduce_scatter, stage 3 comes here only for a bucket over its size: left to DeepSpeed, as
        # reduces_to_views (and so the governor's reserve) has it
        takes_views = governor_of(self) is not None and accelerator_is_host() and self.reduce_scatter
        token = _REDUCING_FOR.set(self if takes_views else None)
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


__all__ = ["marking_tencache_reductions", "reduces_to_views", "reducing_without_copy_at_one_rank",
           "reductions_without_copy"]
