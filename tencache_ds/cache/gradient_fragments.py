"""Gradient fragments read where they lie. Owns: remembering, for each fragment of an optimizer sub-group's
gradient, the host copy of its values that the caller keeps unchanged until the update, and filling the sub-group's
gradient buffer from those copies then. Remembering a kept copy costs no memory and no I/O: such a gradient makes
no NVMe round trip, and its fragments are not copied when they arrive. Does not own: which copy is kept for a
fragment (the caller's lookup: integrations/deepspeed/stage3_gradients.py finds stage 3's), fragments without one
(the optimizer store stores them: cache/write_back.py), the gradient buffer filled (the store lends it), when
fragments arrive or are used (integrations/deepspeed/optimizer_gradients.py).

A kept copy may be of a narrower dtype than the fragment (bf16 gradients, an fp32 optimizer): the fill widens it,
which is exact; the lookup only offers copies for which it is.

A fragment not handed again (a parameter that got no gradient in a later window: a branch or head a batch does not
use) is read again at later updates, as stock CPU offload reads what its gradient buffer last held there. Each update
multiplies its lent gradient in place (the unscale and clip factor, ``scaled``); stock's buffer keeps those products,
so the fill multiplies such a fragment by each factor since it was handed, in order: the same float operations. After
``REPLAY_BEFORE_KEEPING`` factors the product is kept as that fragment's bytes (host memory the size of its part,
until it is handed again), so that a fill's work stays bounded however long the parameter goes unused.

Plain class: imports torch, not DeepSpeed.
"""
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Set, Tuple

import torch

Part = Tuple[int, torch.Tensor]  # (element offset in the sub-group's gradient, fragment)
# Factors a fill applies to a fragment before it keeps the product: a read between steps (a getter after the step:
# one factor) copies nothing, and no fill multiplies a fragment more than this many times.
REPLAY_BEFORE_KEEPING = 4
# (offset, fragment) -> the copy of the fragment's values its caller keeps until the update, or None
KeptCopy = Callable[[int, torch.Tensor], Optional[torch.Tensor]]


class GradientFragments:
    """The remembered fragments of each sub-group's gradient (by sub-group id), newest per offset."""

    def __init__(self):
        self.remembered = 0  # fragments remembered by a kept copy, in all
        self.stored = 0      # fragments returned for storing, in all
        self._window = 0     # accumulation windows ended (end_window)
        self._handed_in: Dict[Hashable, Dict[int, int]] = {}  # group -> offset -> window its fragment was handed in
        # group -> offsets whose kept copy the caller changed after handing it, without handing it again
        self._changed_unhanded: Dict[Hashable, Set[int]] = {}
        self._views: Dict[Hashable, Dict[int, torch.Tensor]] = {}
        self._only_views: Set[Hashable] = set()  # lent gradients filled from fragments alone: nothing to keep
        # group -> (window, factor) for each time an update multiplied its lent gradient, since its oldest fragment
        self._scales: Dict[Hashable, List[Tuple[int, torch.Tensor]]] = {}
        # group -> offset -> (window, bytes): an unhanded fragment as stock's buffer held it when that window's update
        # began (the factors since its hand-off applied)
        self._replayed: Dict[Hashable, Dict[int, Tuple[int, torch.Tensor]]] = {}

    def remember(self, group, parts: Sequence[Part], kept_copy: KeptCopy) -> List[Part]:
        """Remember the kept copy of each part that has one; returns the others, to be stored (a stored part is
        newer than a fragment remembered at its offset before, which is forgotten)."""
        views = self._views.setdefault(group, {})
        handed_in = self._handed_in.setdefault(group, {})
        stored = []
        changed = self._changed_unhanded.get(group, set())
        replayed = self._replayed.get(group, {})
        for offset, fragment in parts:
            changed.discard(offset)  # handed again: its newest bytes are what is remembered or stored
            replayed.pop(offset, None)
            kept = kept_copy(offset, fragment)
            if kept is not None:
                views[offset] = kept
                handed_in[offset] = self._window
            else:
                views.pop(offset, None)
                handed_in.pop(offset, None)
                stored.append((offset, fragment))
        self.remembered += len(parts) - len(stored)
        self.stored += len(stored)
        return stored

    def end_window(self) -> None:
        """An optimizer step ended its accumulation window: fragments remembered so far were handed in an earlier
        one from now on. Factors older than a group's oldest fragment apply to none of them any more."""
        self._window += 1
        for group, scales in self._scales.items():
            oldest = min(self._replay_from(group).values(), default=self._window)
            scales[:] = [(window, factor) for window, factor in scales if window >= oldest]

    def scaled(self, group, factor: torch.Tensor) -> None:
        """The update multiplied ``group``'s lent gradient in place by ``factor`` (one fp32 element): fragments
        handed in this window or before and not since are read so at later updates."""
        if self._handed_in.get(group) and factor.item() != 1.0:  # one (no clipping, no loss scale) changes no byte
            self._scales.setdefault(group, []).append((self._window, factor))

    def factors_kept(self, group) -> int:
        """Factors kept for ``group`` (those a later fill may still apply)."""
        return len(self._scales.get(group, ()))

    def _replay_from(self, group) -> Dict[int, int]:
        """offset -> the window from which factors apply to the bytes a fill copies, for the fragments that get
        them (not those the caller changed)."""
        changed, replayed = self._changed_unhanded.get(group, set()), self._replayed.get(group, {})
        return {offset: replayed[offset][0] if offset in replayed else window
                for offset, window in self._handed_in.get(group, {}).items() if offset not in changed}

    def not_handed_this_window(self, group) -> List[int]:
        """Offsets of ``group`` whose remembered copy was handed in an earlier window, not this one: the update reads
        what the caller's copy holds now, which is what was handed only if the caller has not changed it since."""
        return sorted(offset for offset, window in self._handed_in.get(group, {}).items() if window < self._window)

    def groups(self) -> List[Hashable]:
        return list(self._views)

    def note_changed_unhanded(self, group, offsets: Sequence[int]) -> None:
        """The caller changed the kept copies at ``offsets`` without handing them again (so they no longer hold
        what was handed); remembered until they are handed again, or the group is forgotten."""
        if offsets:
            self._changed_unhanded.setdefault(group, set()).update(offsets)

    def changed_unhanded(self, group) -> Set[int]:
        return self._changed_unhanded.get(group, set())

    def has(self, group) -> bool:
        return bool(self._views.get(group))

    def fill(self, group, gradient: torch.Tensor, alone: bool) -> None:
        """Copy the remembered fragments into ``gradient``, widened to its dtype. ``alone``: nothing else was
        stored for the sub-group, so the elements no fragment covers are zeroed (as in stock's sparse file), and
        the buffer is a copy of bytes someone else keeps (``filled_alone``)."""
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
        replay_from, scales = self._replay_from(group), self._scales.get(group, ())
        replayed = self._replayed.setdefault(group, {})
        for offset, fragment in parts:
            region = gradient.narrow(0, offset, fragment.numel())
            if offset not in replay_from:  # the caller changed its copy since: nothing stock kept to replay
                region.copy_(fragment.reshape(-1))
                continue
            since = replay_from[offset]
            region.copy_((replayed[offset][1] if offset in replayed else fragment).reshape(-1))
            factors = [factor for window, factor in scales if since <= window < self._window]
            for factor in factors:
                region.mul_(factor)
            if len(factors) >= REPLAY_BEFORE_KEEPING:
                replayed[offset] = (self._window, region.clone())

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
        self._handed_in.pop(group, None)
        self._changed_unhanded.pop(group, None)
        self._scales.pop(group, None)
        self._replayed.pop(group, None)
        self._only_views.discard(group)

    def clear(self) -> None:
        """A checkpoint was loaded: no gradient survives it."""
        self._views, self._only_views, self._handed_in, self._changed_unhanded = {}, set(), {}, {}
        self._scales, self._replayed = {}, {}
