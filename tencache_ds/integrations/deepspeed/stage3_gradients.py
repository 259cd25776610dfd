"""Stage 3's own host copy of each reduced gradient. Owns: finding, for a gradient fragment that stage 3 hands the
optimizer swapper, the view of stage 3's gradient partition buffer that holds the same values, so that the swapper
remembers that view (cache/gradient_fragments.py) instead of copying the fragment. Does not own: what is remembered
or filled (cache/gradient_fragments.py), when fragments arrive (optimizer_swapper.py).

What DeepSpeed 0.19.8 does (stage3.py ``partition_grads``, per reduced parameter partition), with the optimizer
offloaded, which it is whenever an optimizer swapper exists:
- its gradient partition buffer (``grad_partitions_flat_buffer``, one view per parameter in
  ``__param_id_to_grad_partition``) is host memory (``self.device`` is cpu), of the gradient accumulation dtype;
- the reduced partition is copied (or, in later micro-batches, accumulated) into that view;
- at the accumulation boundary the swapper is handed ``view.to(accelerator).to(fp32)`` at the sub-group offset
  ``grad_position`` gives: the view itself on the CPU accelerator with fp32 gradients, a cast of it with bf16
  gradients, a device copy of it on a GPU.
So the fragment's values are the view's, widened. bf16 and fp16 widen to fp32 exactly, so copying the view into
the update's fp32 gradient gives the bits the fragment has: no copy in the backward (on a GPU: no second
device-to-host copy of bytes stage 3 already copied), no host memory held for gradients, no NVMe round trip.

Why reading the view at the update is safe:
- stage 3 changes the buffer only in the next backward (its first micro-batch copies over it), after the update;
- on a GPU the copy into it is issued on ``reduce_and_partition_stream``, which the backward's epilogue
  synchronises (``independent_gradient_partition_epilogue``) before ``step()`` can run; stock CPU offload's update
  reads its own copy of the same gradient, issued from the same loop right after, on the same guarantee.
These facts are in contract.py (PRIVATE_MEMBERS, CALL_ORDER); the parity tests check the bits.
"""
import os
import weakref
from typing import Dict, Hashable, Optional

import torch
from deepspeed.runtime.swap_tensor.optimizer_utils import OptimizerSwapper

# (kept dtype, fragment dtype): copying a tensor of the first into one of the second changes no value
EXACT_WIDENINGS = {(torch.bfloat16, torch.float32), (torch.float16, torch.float32)}
_GRAD_PARTITIONS = "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition"
# Tests: set to 1, no fragment's copy is looked up, so every fragment is stored, as where stage 3 keeps none (a
# DeepSpeed that hands fragments some other way); the real engine then runs the store's path for them
# (tests/deepspeed/test_residency.py).
STORE_GRADIENT_FRAGMENTS_ENV = "TENCACHE_STORE_GRADIENT_FRAGMENTS"


def widens_exactly(kept: torch.dtype, fragment: torch.dtype) -> bool:
    return kept == fragment or (kept, fragment) in EXACT_WIDENINGS


def stage3_gradients_of(optimizer) -> Optional["Stage3Gradients"]:
    """The lookup for the ZeRO-3 optimizer that builds a swapper (None when it was not found, or under
    STORE_GRADIENT_FRAGMENTS_ENV: every fragment is then stored)."""
    if optimizer is None or os.environ.get(STORE_GRADIENT_FRAGMENTS_ENV) == "1":
        return None
    return Stage3Gradients(optimizer)


class Stage3Gradients:
    """The host views of one ZeRO-3 optimizer's gradient partition buffer, by optimizer sub-group (the id of its
    fp32 partition, as the swapper is handed it) and element offset in the sub-group. Built at the first lookup:
    the buffer is allocated after the swapper."""

    def __init__(self, optimizer):
        self._optimizer = weakref.ref(optimizer)  # the optimizer owns the swapper that owns this
        self._views: Optional[Dict[Hashable, Dict[int, torch.Tensor]]] = None

    def host_copy(self, sub_group, offset: int, fragment: torch.Tensor) -> Optional[torch.Tensor]:
        """The view of stage 3's host buffer whose values ``fragment`` (handed for ``sub_group`` at ``offset``)
        holds, or None when there is none (then the fragment is the only copy: store it)."""
        if self._views is None:
            self._views = self._index()
        view = self._views.get(sub_group, {}).get(offset)
        if view is None or view.numel() != fragment.numel() or not widens_exactly(view.dtype, fragment.dtype):
            return None
        return view

    def _index(self) -> Dict[Hashable, Dict[int, torch.Tensor]]:
        optimizer = self._optimizer()
        partitions = getattr(optimizer, _GRAD_PARTITIONS, None) if optimizer is not None else None
        if not partitions or optimizer.grad_partitions_flat_buffer.device.type != "cpu":
            return {}
        views = {}
        for index, params in enumerate(optimizer.fp16_groups):
            by_offset = views.setdefault(OptimizerSwapper.parameter_id(optimizer.fp32_partitioned_groups_flat[index]),
                                         {})
            for param in params:
                position = optimizer.grad_position.get(optimizer.get_param_id(param))
                view = partitions.get(param.ds_id)
                if position is not None and view is not None and position[0] == index and view.numel() == position[2]:
                    by_offset[position[1]] = view
        return views


__all__ = ["Stage3Gradients", "stage3_gradients_of", "widens_exactly", "EXACT_WIDENINGS",
           "STORE_GRADIENT_FRAGMENTS_ENV"]
