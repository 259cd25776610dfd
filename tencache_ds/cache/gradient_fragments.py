"""Gradient fragments read where they lie. Owns: remembering, per optimizer sub-group, the fragments of its gradient
that are views of a host buffer the caller keeps unchanged until the update, and filling the sub-group's gradient
buffer from them then. Remembering a view costs no memory and no I/O: such a gradient makes no NVMe round trip.
Does not own: fragments that are not views (the optimizer store stores them: cache/write_back.py), the gradient
buffer filled (the store lends it), when fragments arrive or are used (integrations/deepspeed/optimizer_swapper.py).

Stage 3 accumulates gradients in one partition buffer (``grad_partitions_flat_buffer``) that it changes only in the
next backward; with fp32 gradients on a host accelerator every fragment it hands the optimizer swapper is a view of
it. DeepSpeed relies on that itself: fragments shorter than an aligned block stay there, by reference, as its
swapper's ``unswapped_gradients`` (stock's ``_writeback_gradients`` writes into those views; tencache's swapper
never does: a written-back gradient is stored). A fragment cast for the call (bf16 gradients, fp32 optimizer) or on
a device is an allocation of its own, which remembering would keep alive: it is stored instead.

Plain class: imports torch, not DeepSpeed.
"""
from typing import Dict, Hashable, List, Sequence, Set, Tuple

import torch

Part = Tuple[int, torch.Tensor]  # (element offset in the sub-group's gradient, fragment)


def lies_in_kept_buffer(fragment: torch.Tensor, dtype: torch.dtype) -> bool:
    """Is ``fragment`` a view of a host buffer of ``dtype`` (so that remembering it costs no memory)?"""
    return fragment.device.type == "cpu" and fragment.dtype == dtype and fragment._base is not None


class GradientFragments:
    """The remembered fragments of each sub-group's gradient (by sub-group id), newest per offset."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self._views: Dict[Hashable, Dict[int, torch.Tensor]] = {}
        self._only_views: Set[Hashable] = set()  # lent gradients filled from fragments alone: nothing to keep

    def remember(self, group, parts: Sequence[Part]) -> List[Part]:
        """Remember the parts that lie in a kept buffer; returns the others, to be stored (a stored part is newer
        than a fragment remembered at its offset before, which is forgotten)."""
        views = self._views.setdefault(group, {})
        stored = []
        for offset, fragment in parts:
            if lies_in_kept_buffer(fragment, self.dtype):
                views[offset] = fragment
            else:
                views.pop(offset, None)
                stored.append((offset, fragment))
        return stored

    def has(self, group) -> bool:
        return bool(self._views.get(group))

    def fill(self, group, gradient: torch.Tensor, alone: bool) -> None:
        """Copy the remembered fragments into ``gradient``. ``alone``: nothing else was stored for the sub-group,
        so the elements no fragment covers are zeroed (as in stock's sparse file), and the buffer is a copy of
        bytes someone else keeps (``filled_alone``)."""
        parts = sorted(self._views.get(group, {}).items())
        if not alone:
            self._only_views.discard(group)
        else:
            self._only_views.add(group)
            end = 0
            for offset, fragment in parts:
                if offset > end:
                    gradient.narrow(0, end, offset - end).zero_()
                end = max(end, offset + fragment.numel())
            if end < gradient.numel():
                gradient.narrow(0, end, gradient.numel() - end).zero_()
        for offset, fragment in parts:
            gradient.narrow(0, offset, fragment.numel()).copy_(fragment.reshape(-1))

    def filled_alone(self, group) -> bool:
        """Was the sub-group's lent gradient filled from remembered fragments alone (its bytes need neither keeping
        nor writing)? Asked once, when it is given back."""
        if group in self._only_views:
            self._only_views.discard(group)
            return True
        return False

    def forget(self, group) -> None:
        """The sub-group's lent gradient was changed by its borrower: its bytes, not the fragments, are the newest."""
        self._views.pop(group, None)
        self._only_views.discard(group)

    def clear(self) -> None:
        """A checkpoint was loaded: no gradient survives it."""
        self._views, self._only_views = {}, set()
