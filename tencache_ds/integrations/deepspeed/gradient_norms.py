"""Stage 3's per-gradient norms, taken over one reused host buffer. Owns: which optimizers take their norms that way,
the norm itself (DeepSpeed's operations, with the widening copy written into the buffer), and letting the buffer go
when the optimizer step starts. Does not own: the buffer (memory/reused_scratch.py).

What DeepSpeed 0.19.8 does (stage3.py ``_constant_buffered_norm2``), for every reduced gradient partition at the
accumulation boundary (``_offload_grad_partition_at_boundary``) and for a gradient set through
``set_local_grad_for_param``:

    for part in input.view(-1).split(buffer_size):          # 250 M elements
        norm = part.data.to(get_norm_dtype()).norm(2) ** 2.0  # first part; later ones: norm += ...
    return norm ** 0.5

``.to(float64)`` is a fresh tensor the size of the gradient. Above glibc's mmap threshold (4 Mi fp32 elements) it is
a new mapping every time, so on a host accelerator each norm first faults its pages in: on gpt2-1.3b 9.5 GiB of
fresh memory a backward, in stock and tencache alike; with the copies in one buffer its backward took 5.2 s instead
of 6.6-7.4 (docs/benchmarks.md, "Beyond RAM, traced by phase").

Ours: the same parts, the same operations in the same order, with the widening written into one buffer
(``copy_``: fp32 and bf16 widen to float64 exactly, so the copy holds the values ``.to`` gives) that is reused from
norm to norm. The norm then runs over the same values in the same contiguous layout from the same alignment: the
bits are the fresh copy's (tests/deepspeed/test_gradient_norms.py, and every parity test with gradient clipping).

Only for host tensors: on a device a fresh tensor comes from the caching allocator, and a buffer would hold device
memory: DeepSpeed's own method there (with a GPU, stage 3 moves each gradient partition to the device before its
norm, so this is the CPU accelerator's case). Only for optimizers that tencache swaps for (the host governor is
attached: reporting.attach_step_meter): a stock engine in the same process is untouched. The buffer, as large as the
largest copy up to ``NORM_SCRATCH_MAX_BYTES`` (the largest gradient partition within it, allocated at the first
norm, so that one buffer serves a backward whatever order its gradients come in), is let go where the optimizer
step starts and where the engine is destroyed, so between steps the process holds what stock's holds; during the
backward it holds it from the first norm on, where stock holds each copy for one norm: that difference is what the
ceiling bounds.
"""
import functools
from typing import Optional

import torch

from deepspeed.runtime.zero.utils import get_norm_dtype

from ...memory.reused_scratch import ReusedScratch
# the ceiling, and why: there (the step model prices it), and DeepSpeed's chunk
from ...plan.step_model.costs import NORM_CHUNK_ELEMENTS, NORM_SCRATCH_MAX_BYTES
from .memory_pressure import governor_of

SCRATCH_ATTRIBUTE = "_tencache_norm_scratch"  # on the ZeRO-3 optimizer: its ReusedScratch


def attach_norm_scratch(optimizer) -> None:
    """A built ZeRO-3 optimizer: its norms reuse one buffer if tencache swaps any of its tensors."""
    if governor_of(optimizer) is not None:
        element_size = torch.empty((), dtype=get_norm_dtype()).element_size()
        within = [chunk for chunk in (min(param.partition_numel(), NORM_CHUNK_ELEMENTS)
                                      for group in optimizer.fp16_groups for param in group)
                  if chunk * element_size <= NORM_SCRATCH_MAX_BYTES]
        setattr(optimizer, SCRATCH_ATTRIBUTE, ReusedScratch(NORM_SCRATCH_MAX_BYTES, max(within, default=0)))


def norm_scratch_of(optimizer) -> Optional[ReusedScratch]:
    return getattr(optimizer, SCRATCH_ATTRIBUTE, None)


def release_norm_scratch(optimizer) -> None:
    """The optimizer step starts (the backward's norms are done: they run at the accumulation boundary), or the
    engine is destroyed."""
    scratch = norm_scratch_of(optimizer)
    if scratch is not None:
        scratch.release()


def norming_in_reused_memory(original):
    """Wraps stage 3's ``_constant_buffered_norm2``: DeepSpeed 0.19.8's loop, with the float64 copy in the
    optimizer's scratch where it has one, the gradient is in host memory and the copy is within the scratch's
    ceiling (else DeepSpeed's fresh copy, for that part)."""
    @functools.wraps(original)
    def constant_buffered_norm2(self, input, buffer_size=250000000):
        scratch = norm_scratch_of(self)
        if scratch is None or input.device.type != "cpu":
            return original(self, input, buffer_size)
        norm_dtype = get_norm_dtype()
        norm = None
        for part in input.view(-1).split(buffer_size):
            widened = scratch.view(part.numel(), norm_dtype, part.device)
            if widened is None:
                widened = part.data.to(norm_dtype)
            else:
                widened.copy_(part.data)
            if norm is None:
                norm = widened.norm(2)**2.0
            else:
                norm += widened.norm(2)**2.0
            del widened  # a fresh copy goes back before the next part's is made, as in DeepSpeed's loop
        return norm**0.5

    return constant_buffered_norm2


__all__ = ["attach_norm_scratch", "norm_scratch_of", "release_norm_scratch", "norming_in_reused_memory"]
