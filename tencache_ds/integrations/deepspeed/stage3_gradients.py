"""Stage 3's own host copy of each reduced gradient. Owns: finding, for a gradient fragment that stage 3 hands the
optimizer swapper, the view of stage 3's gradient partition buffer that holds the same values, so that the swapper
remembers that view (cache/gradient_fragments.py) instead of copying the fragment; and telling the swapper the
factor stage 3 scales each sub-group's gradient by in place (``noting_gradient_scales``). Does not own: what is
remembered or filled (cache/gradient_fragments.py), when fragments arrive (optimizer_gradients.py).

What DeepSpeed 0.19.8 does (stage3.py ``partition_grads``, per reduced parameter partition), with the optimizer
offloaded, which it is whenever an optimizer swapper exists:
- its gradient partition buffer (``grad_partitions_flat_buffer``, one view per parameter in
  ``__param_id_to_grad_partition``) is host memory (``self.device`` is cpu), of the gradient accumulation dtype;
- the reduced partition is copied (or, in later micro-batches, accumulated) into the first elements of that view:
  all of them, or fewer on a rank whose share of an unevenly split parameter is shorter;
- at the accumulation boundary (``_offload_grad_partition_at_boundary``) the swapper is handed those elements as
  ``.to(accelerator).to(fp32)``, at the sub-group offset ``grad_position`` gives: the view itself on the CPU
  accelerator with fp32 gradients, a cast of it with bf16 gradients, a device copy of it on a GPU.
So the fragment's values are the view's, widened. The cast is then work for nothing: a new fp32 tensor the size
of every gradient, each step (gpt2-medium in bf16: 1.4 GB), which the swapper never reads. Where the view will be
found, ``handing_gradients_uncast`` hands the fragment as it is (bf16 when the gradients are; the swapper widens
the view at the update either way). bf16 and fp16 widen to fp32 exactly, so copying the view into
the update's fp32 gradient gives the bits the fragment has: no copy in the backward (on a GPU: no second
device-to-host copy of bytes stage 3 already copied), no host memory held for gradients, no NVMe round trip.

Why reading the view at the update gives the fragment's values:
- stage 3 writes a parameter's view only when it reduces that parameter's gradient again, which at the earliest is
  in the next window's first backward, after the update;
- on a GPU the copy into it is issued on ``reduce_and_partition_stream``, which the backward's epilogue
  synchronises (``independent_gradient_partition_epilogue``) before ``step()`` can run; stock CPU offload's update
  reads its own copy of the same gradient, issued from the same loop right after, on the same guarantee;
- the views are looked up at each hand-off, not kept from the first one: ``offload_states`` / ``reload_states``
  replace the buffer and its views.
Where this differs from stock: a parameter reduced in an earlier micro-batch of an accumulation window but not in
its last one is handed at no boundary. Stock's update then reads the bytes its file got at the last hand-off (the
window's gradient of that parameter is lost); a view remembered from that hand-off reads what stage 3 accumulated
since. The swapper counts such reads and warns at the first (``reductions``, ``param_at``;
``optimizer_gradient_fragments_reduced_not_handed``). Models whose every parameter gets a gradient in every
micro-batch (all of ours) see no difference.
A parameter reduced in no micro-batch of a window (a head or branch that window's batches do not use) is handed at
no boundary either, and its view still holds what was handed. Stock CPU offload's update reads what its own gradient
buffer last held there: those bytes multiplied in place by each update's unscale and clip since (with DeepSpeed's
default clipping, 1.0, whenever the gradient norm is above 1). The swapper is told each factor
(``noting_gradient_scales``) and the fill replays them in order (cache/gradient_fragments.py), which gives stock CPU
offload's bits; stock NVMe's update reads its file unscaled there (and at 2 ranks changed a head no batch had used
yet at the first step). Not replayed: a GradScaler's
own unscale (``torch_autocast`` in fp16, a GPU path), and a gradient the tier stores with no view filled over it
(``STORE_GRADIENT_FRAGMENTS_ENV``), whose scaled bytes stay where the tier holds it and not where it streams.
These facts are in contract.py (PRIVATE_MEMBERS, CALL_ORDER); the parity tests check the bits.
"""
import functools
import os
import types
import weakref
from typing import Dict, Hashable, Optional, Set

import torch
from deepspeed.runtime.swap_tensor.optimizer_utils import OptimizerSwapper

# (kept dtype, fragment dtype): copying a tensor of the first into one of the second changes no value
EXACT_WIDENINGS = {(torch.bfloat16, torch.float32), (torch.float16, torch.float32)}
_GRAD_PARTITIONS = "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition"
_WINDOW_REDUCTIONS = "_offload_boundary_param_ids"  # ds_ids reduced in this window; a new set at every step
# Tests: set to 1, no fragment's copy is looked up, so every fragment is stored, as where stage 3 keeps none (a
# DeepSpeed that hands fragments some other way); the real engine then runs the store's path for them
# (tests/deepspeed/test_residency.py).
STORE_GRADIENT_FRAGMENTS_ENV = "TENCACHE_STORE_GRADIENT_FRAGMENTS"


def widens_exactly(kept: torch.dtype, fragment: torch.dtype) -> bool:
    return kept == fragment or (kept, fragment) in EXACT_WIDENINGS


def stage3_gradients_of(optimizer) -> Optional["Stage3Gradients"]:
    """The lookup for the ZeRO-3 optimizer that builds a swapper (None when it was not found, runs ZenFlow, or
    under STORE_GRADIENT_FRAGMENTS_ENV: every fragment is then stored)."""
    if optimizer is None or os.environ.get(STORE_GRADIENT_FRAGMENTS_ENV) == "1":
        return None
    if getattr(optimizer, "zenflow", False):  # its own partition_grads and overlapped update: not checked here
        return None
    return Stage3Gradients(optimizer)


class Stage3Gradients:
    """Stage 3's host gradient views of one ZeRO-3 optimizer, by optimizer sub-group (the id of its fp32 partition,
    as the swapper is handed it) and element offset in the sub-group. Which parameter lies at each offset is indexed
    at the first lookup (the buffer is allocated after the swapper); its view is read from stage 3 at every lookup,
    since stage 3 may replace the buffer (``offload_states``)."""

    def __init__(self, optimizer):
        self._optimizer = weakref.ref(optimizer)  # the optimizer owns the swapper that owns this
        self._params: Optional[Dict[Hashable, Dict[int, int]]] = None  # sub-group -> offset -> ds_id

    def host_copy(self, sub_group, offset: int, fragment: torch.Tensor) -> Optional[torch.Tensor]:
        """The elements of stage 3's host buffer whose values ``fragment`` (handed for ``sub_group`` at ``offset``)
        holds, or None when there are none (then the fragment is the only copy: store it)."""
        optimizer = self._optimizer()
        if optimizer is None:
            return None
        if self._params is None:
            self._params = self._index(optimizer)
        ds_id = self._params.get(sub_group, {}).get(offset)
        view = getattr(optimizer, _GRAD_PARTITIONS, {}).get(ds_id) if ds_id is not None else None
        if (view is None or view.device.type != "cpu" or fragment.numel() > view.numel()
                or not widens_exactly(view.dtype, fragment.dtype)):
            return None
        return view.narrow(0, 0, fragment.numel())

    def reductions(self) -> Optional[Set[int]]:
        """The parameters (ds_id) stage 3 has reduced in the current accumulation window so far. Stage 3 starts a
        new set at each step, so a reference taken during a window keeps that window's."""
        optimizer = self._optimizer()
        return getattr(optimizer, _WINDOW_REDUCTIONS, None) if optimizer is not None else None

    def param_at(self, sub_group, offset: int) -> Optional[int]:
        """The ds_id of the parameter whose gradient lies at ``offset`` of ``sub_group``'s."""
        return (self._params or {}).get(sub_group, {}).get(offset)

    @staticmethod
    def _index(optimizer) -> Dict[Hashable, Dict[int, int]]:
        params = {}
        for index, group in enumerate(optimizer.fp16_groups):
            sub_group = OptimizerSwapper.parameter_id(optimizer.fp32_partitioned_groups_flat[index])
            by_offset = params.setdefault(sub_group, {})
            for param in group:
                position = optimizer.grad_position.get(optimizer.get_param_id(param))
                if position is not None and position[0] == index:
                    by_offset[position[1]] = param.ds_id
        return params


def handing_gradients_uncast(original):
    """Wraps stage 3's ``_offload_grad_partition_at_boundary``, which records a parameter's gradient norm and hands
    its reduced partition to the optimizer swapper cast to the master dtype: where the swapper will read stage 3's
    host copy of it instead (``reads_stage3_copy``), the partition is handed without the cast, which nothing would
    read. Everything else (another swapper, a sub-group not swapped, a fragment the swapper stores) goes to
    DeepSpeed's own method."""
    @functools.wraps(original)
    def offload_grad_partition_at_boundary(self, param, grad_buffer, offload_fp32_gradients, offload_fp32_offsets):
        param_id = self.get_param_id(param)
        sub_group, offset, _ = self.grad_position[param_id]
        reads_copy = getattr(getattr(self, "optimizer_swapper", None), "reads_stage3_copy", None)
        if not (reads_copy is not None and self._swappable_optimizer_subgroup(sub_group)
                and reads_copy(self.fp32_partitioned_groups_flat[sub_group], offset, grad_buffer)):
            return original(self, param, grad_buffer, offload_fp32_gradients, offload_fp32_offsets)
        # DeepSpeed 0.19.8's branch for a swapped sub-group, in its order, less the cast
        self.norm_for_param_grads[param_id] = self._constant_buffered_norm2(grad_buffer)
        offload_fp32_gradients.setdefault(sub_group, []).append(grad_buffer)
        offload_fp32_offsets.setdefault(sub_group, []).append(offset)

    return offload_grad_partition_at_boundary


class _FactorProbe:
    """Stage 3 as its ``unscale_and_clip_grads`` sees it, except that the sub-group's gradient is one element of
    ones: what the call leaves there is the factor it multiplies the gradient by (DeepSpeed's formula, not a copy)."""

    def __init__(self, stage3, sub_group_id: int, like: torch.Tensor):
        self._stage3 = stage3
        # fp32 whatever the gradient's dtype: stock multiplies a bf16 or fp16 gradient by the factor as fp32
        self.factor = torch.ones(1, dtype=torch.float32, device=like.device)
        self.fp32_partitioned_groups_flat = {sub_group_id: types.SimpleNamespace(grad=self.factor)}

    def __getattr__(self, name):
        return getattr(self._stage3, name)


def noting_gradient_scales(original):
    """Wraps stage 3's ``unscale_and_clip_grads``, which multiplies a sub-group's gradient in place before the
    update: after it, a tencache optimizer swapper is told the factor (``gradient_scaled``; why: the module's
    docstring). Another swapper, or a sub-group not swapped, goes to DeepSpeed's method alone."""
    @functools.wraps(original)
    def unscale_and_clip_grads(self, sub_group_id, total_norm):
        result = original(self, sub_group_id, total_norm)
        gradient_scaled = getattr(getattr(self, "optimizer_swapper", None), "gradient_scaled", None)
        if gradient_scaled is not None and self._swappable_optimizer_subgroup(sub_group_id):
            master = self.fp32_partitioned_groups_flat[sub_group_id]
            probe = _FactorProbe(self, sub_group_id, master.grad)
            original(probe, sub_group_id, total_norm)  # reads the loss scale and clip, which the call left as they were
            gradient_scaled(master, probe.factor)
        return result

    return unscale_and_clip_grads


__all__ = ["Stage3Gradients", "stage3_gradients_of", "handing_gradients_uncast", "noting_gradient_scales",
           "STORE_GRADIENT_FRAGMENTS_ENV"]
