"""The sub-groups' fp32 gradients, as one optimizer swapper is handed them and lends them to the update. Owns: what
happens to each fragment stage 3 hands (its host copy remembered, or the fragment stored in the tier), how a
sub-group's gradient is lent to its update (filled from the remembered copies into a transient buffer, over the
stored gradient where there is one, or the stored one alone) and how it comes back (discarded where it was a copy,
released otherwise), the accumulation windows (the parameters stage 3 reduced in a window without handing them,
counted and warned about), and the gradient counters in stats. optimizer_swapper.py asks it at each hand-off,
swap-in, give-back, write-back through DeepSpeed's API, step end and checkpoint load.

The two mechanisms it combines keep their own rules: which view of stage 3's buffer holds a fragment's values, and
why reading it at the update gives stock's bits (stage3_gradients.py); what is remembered per offset and window,
and the fill (cache/gradient_fragments.py). The store (cache/optimizer_store.py) holds and moves the bytes.

Without stage 3's lookup (an optimizer swapper made outside its initialisation, or
``TENCACHE_STORE_GRADIENT_FRAGMENTS``) every fragment is stored, as stock stores them in its files.
"""
from typing import Callable, Hashable, List, Optional, Sequence

import torch

from ...cache.gradient_fragments import GradientFragments
from ...log import logger
from .stage3_gradients import stage3_gradients_of


def gradient_path(swap_info) -> str:
    """The one file a sub-group's gradient fragments share (``<ds_id>_gradient_0_<numel>.tensor.swp``)."""
    [fragment] = swap_info.swapped_gradients.values()
    return fragment.path


class SubGroupGradients:
    """For one optimizer swapper.

    Args:
        stage3: the ZeRO-3 optimizer (None: no copy is looked up; every fragment is stored).
        store: the swapper's OptimizerStore, which stores fragments without a copy and lends the update's buffers.
        dtype: the masters' dtype, in which the update's gradient is lent.
    """

    def __init__(self, stage3, store, dtype: torch.dtype):
        self.store = store
        self.dtype = dtype
        self.fragments = GradientFragments()
        self.stage3 = stage3_gradients_of(stage3)  # None: no lookup
        self.stored = set()  # sub-group ids whose gradient the store holds (a fragment without a copy, a write-back)
        self.written_back_groups = set()  # ... of them, those set through DeepSpeed's API or Muon's write-back
        self.reduced_not_handed = 0  # updates' reads of fragments stage 3 changed without handing them
        self.uncast = 0  # fragments handed without stage 3's cast to the master dtype
        # stage 3's set of the parameters reduced in this window (it starts a new one at each step: taken at each
        # window's end and hand-off, it is that window's)
        self._window_reductions = None
        self._counted_this_window = set()  # (sub-group, offset) read so and counted in this window

    # ---------------------------------------------------------------------------------------- what is held
    @property
    def views(self) -> bool:
        """Are stage 3's host copies of the gradients looked up? Then the tier holds no gradient but those of the
        sub-groups in ``stored``."""
        return self.stage3 is not None

    def held_by_store(self, group) -> bool:
        """Would the tier hold sub-group ``group``'s gradient (what its footprint arithmetic counts)?"""
        return not self.views or group in self.stored

    def update_slots(self, sub_groups: int) -> int:
        """Streaming slots an update lends even when the tier keeps everything: the transient buffer a gradient
        read from stage 3's buffer is filled into (``lend``), one sub-group at a time."""
        return 1 if self.views and len(self.stored) < sub_groups else 0

    # -------------------------------------------------------------------------------------------- hand-offs
    def handed(self, group, swap_info, offsets: Sequence[int], tensors: Sequence[torch.Tensor]) -> None:
        """Stage 3 handed fragments of sub-group ``group``'s gradient (optimizer_swapper.swap_out_gradients): each
        one's host copy is remembered, the others stored at their offsets (EntryStore.write_parts)."""
        self.written_back_groups.discard(group)  # (new fragments: stage 3's again, scaled as before: helper-167)
        stored = self.fragments.remember(group, list(zip(offsets, tensors)), self._kept_copy_in(group))
        # handed in the gradients' own dtype, without stage 3's cast (stage3_gradients.handing_gradients_uncast)
        self.uncast += sum(1 for fragment in tensors if fragment.dtype != self.dtype)
        if self.stage3 is not None:
            self._window_reductions = self.stage3.reductions()
        if stored:
            self.stored.add(group)
            path = gradient_path(swap_info)
            self.store.write_parts(path, swap_info.numel(), path, stored)

    def reads_stage3_copy(self, group, offset: int, fragment) -> bool:
        """Would ``handed`` remember stage 3's host copy of ``fragment`` rather than store it?"""
        return self.stage3 is not None and self.stage3.host_copy(group, offset, fragment) is not None

    def written_back(self, group) -> None:
        """A gradient set through DeepSpeed's API (set_full_fp32_grad): its newest bytes are the lent buffer's,
        kept or written as any changed entry; fragments still in stage 3's buffer are older."""
        self.fragments.forget(group)
        self.stored.add(group)
        self.written_back_groups.add(group)

    # ----------------------------------------------------------------------------------- lend, give back
    def lend(self, group, path: str, numel: int, lend_stored: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The sub-group's gradient for its update: the stored one (``lend_stored``: held, or read), with the
        fragments still in stage 3's buffer copied over it; only those, in a transient buffer, when none was
        stored. That buffer is neither kept nor written (``give_back``)."""
        fragments = self.fragments
        if not fragments.has(group):
            return lend_stored()
        self._note_reduced_not_handed(group)
        alone = not self.store.knows(path)
        if alone:
            gradient = self.store.lend_new(path, numel, path, transient=True)
        else:  # a gradient stored before (a fragment that was no view, or one written back): the views are newer
            gradient = lend_stored()
            self.store.mark_changed(path)
        try:
            fragments.fill(group, gradient, alone)
        except BaseException:  # the buffer goes back, so that the next update can lend it again
            if alone:
                self.store.discard(path)
            else:
                self.store.release(path, changed=True)
            raise
        return gradient

    def give_back(self, group, path: str, changed: bool) -> None:
        """The update is done with the gradient lent at ``path``: a copy of fragments stage 3 still holds is
        discarded (nothing to keep or write), a stored one released."""
        if self.fragments.filled_alone(group):
            self.store.discard(path)
        else:
            self.store.release(path, changed=changed)

    def scaled(self, group, factor: torch.Tensor, path: str) -> None:
        """Stage 3's update multiplied sub-group ``group``'s lent gradient (at ``path``) in place by ``factor``. One
        set through DeepSpeed's API or Muon's write-back and lent from the store alone keeps the scaled bytes, as
        stock CPU offload's buffer does: streamed, its file kept the unscaled ones, so a parameter of it without a
        gradient in a later window read other bits by the budget (helper-147's and helper-163's reviews)."""
        self.fragments.scaled(group, factor)
        if group in self.written_back_groups and not self.fragments.has(group) and factor.item() != 1.0 and \
                self.store.knows(path):
            self.store.mark_changed(path)

    # -------------------------------------------------------------------------------------------- windows
    def end_window(self) -> None:
        """An optimizer step ended (or was skipped): fragments not handed in its window whose parameter stage 3
        reduced in it stay changed until handed again (a later window's update, or the next one after a skipped
        step, reads them so too); the next window's set of reductions is stage 3's new one."""
        stage3, fragments = self.stage3, self.fragments
        if stage3 is None:
            return
        reductions = self._window_reductions or ()
        for group in fragments.groups():
            fragments.note_changed_unhanded(group, [offset for offset in fragments.not_handed_this_window(group)
                                                    if stage3.param_at(group, offset) in reductions])
        fragments.end_window()
        self._counted_this_window = set()
        self._window_reductions = stage3.reductions()  # step() began with _pre_step: already the next window's

    def forget_all(self) -> None:
        """A checkpoint was loaded: no gradient survives it (stock's checkpoints skip them too)."""
        self.fragments.clear()
        self.written_back_groups.clear()
        self._counted_this_window = set()
        self.stored = set()

    def stats(self) -> dict:
        return dict(optimizer_gradient_fragments_remembered=self.fragments.remembered,
                    optimizer_gradient_fragments_stored=self.fragments.stored,
                    optimizer_gradient_fragments_reduced_not_handed=self.reduced_not_handed,
                    optimizer_gradient_fragments_uncast=self.uncast)

    # -------------------------------------------------------------------------------------------- private
    def _kept_copy_in(self, group) -> Callable[[int, torch.Tensor], Optional[torch.Tensor]]:
        """The lookup of stage 3's host copy of a fragment of sub-group ``group``'s gradient."""
        stage3 = self.stage3
        if stage3 is None:
            return lambda offset, fragment: None
        return lambda offset, fragment: stage3.host_copy(group, offset, fragment)

    def _note_reduced_not_handed(self, group: Hashable) -> None:
        """Before the update reads the sub-group's remembered fragments: those handed in an earlier window whose
        parameter stage 3 has reduced since without handing it (a gradient in an earlier micro-batch, none in the
        last): the update reads what stage 3 accumulated where stock reads the bytes last handed
        (stage3_gradients.py). Noted as changed at once (so the fill replays no factor on them), counted once per
        fragment and window; a warning at the first."""
        stage3, fragments = self.stage3, self.fragments
        if stage3 is None:
            return
        reductions = self._window_reductions or ()
        offsets: List[int] = fragments.not_handed_this_window(group)
        fragments.note_changed_unhanded(group, [offset for offset in offsets
                                                if stage3.param_at(group, offset) in reductions])
        changed = fragments.changed_unhanded(group)
        for offset in offsets:
            if (group, offset) in self._counted_this_window:
                continue  # a second swap-in in the window (safe_get_full_grad, Muon) reads the same bytes
            if offset in changed:
                if not self.reduced_not_handed:
                    logger.warning("optimizer sub-group %s: a parameter's gradient was reduced in an earlier "
                                   "micro-batch of an accumulation window but not in its last one; its update "
                                   "reads that gradient, where stock DeepSpeed reads the one of the last window "
                                   "that handed it (stats: optimizer_gradient_fragments_reduced_not_handed)", group)
                self.reduced_not_handed += 1
                self._counted_this_window.add((group, offset))
