"""Gradient fragments remembered where they lie (cache/gradient_fragments.py, pure): a fragment whose values its
caller keeps (the lookup finds a copy) is remembered by that copy, anything else is returned for storing; the
newest part per offset wins; a gradient filled from fragments alone has zeros where none lands, and a kept copy of
a narrower dtype is widened into it."""
import torch

from tencache_ds.cache.gradient_fragments import REPLAY_BEFORE_KEEPING, GradientFragments


def _views_of(flat: torch.Tensor):
    """The lookup for a caller that keeps ``flat``: a fragment that is a view of it is its own kept copy."""
    def kept_copy(_offset, fragment):
        return fragment if fragment._base is flat else None
    return kept_copy


def test_only_fragments_the_lookup_finds_a_kept_copy_for_are_remembered_and_the_copy_is_what_is_read():
    kept = torch.arange(4, dtype=torch.bfloat16)  # the caller's buffer: bf16 gradients
    handed = kept.to(torch.float32)  # the fp32 cast handed for the call: its own allocation
    fragments = GradientFragments()
    stored = fragments.remember("g", [(0, handed), (4, torch.ones(2))],
                                lambda offset, fragment: kept if offset == 0 else None)
    assert [offset for offset, _ in stored] == [4]  # no kept copy: stored
    assert (fragments.remembered, fragments.stored) == (1, 1)
    handed.zero_()  # the cast is freed after the call: the kept copy is what the fill reads
    kept.add_(1)  # and the caller's newest bytes are
    gradient = torch.full((6,), -1.0)
    fragments.fill("g", gradient, alone=False)
    assert gradient.tolist() == [1, 2, 3, 4, -1, -1]  # widened exactly; the stored part's bytes untouched


def test_a_gradient_filled_from_fragments_alone_has_zeros_between_them_and_reads_their_newest_bytes():
    flat = torch.arange(1.0, 11.0)  # stage 3's buffer: 10 elements, two parameters' partitions of 3 and 4
    fragments = GradientFragments()
    assert fragments.remember("g", [(1, flat.narrow(0, 0, 3)), (6, flat.narrow(0, 3, 4))], _views_of(flat)) == []
    flat.mul_(2)  # the buffer changes before the update (a later backward of the same window): the newest wins
    gradient = torch.full((12,), -1.0)
    fragments.fill("g", gradient, alone=True)
    assert gradient.tolist() == [0, 2, 4, 6, 0, 0, 8, 10, 12, 14, 0, 0]
    assert fragments.filled_alone("g") and not fragments.filled_alone("g")  # asked once


def test_a_stored_part_replaces_the_fragment_remembered_at_its_offset_and_fills_over_stored_bytes():
    flat = torch.ones(8)
    fragments = GradientFragments()
    fragments.remember("g", [(0, flat.narrow(0, 0, 4)), (4, flat.narrow(0, 4, 4))], _views_of(flat))
    cast = torch.full((4,), 5.0, dtype=torch.bfloat16).to(torch.float32)  # no kept copy: stored
    stored = fragments.remember("g", [(4, cast)], _views_of(flat))
    assert [offset for offset, _ in stored] == [4]
    gradient = torch.full((8,), 5.0)  # the store's bytes, holding the stored part
    fragments.fill("g", gradient, alone=False)
    assert gradient.tolist() == [1, 1, 1, 1, 5, 5, 5, 5] and not fragments.filled_alone("g")
    fragments.forget("g")
    assert not fragments.has("g")


def test_a_fill_over_stored_bytes_clears_an_earlier_fill_alone():
    """Regression: only giving the gradient back cleared "filled alone"; a fill over stored bytes after a fill
    alone that was never given back (a failed update) left it set, and the stored, budgeted entry would have been
    discarded as a copy of stage 3's bytes."""
    flat = torch.ones(4)
    fragments = GradientFragments()
    fragments.remember("g", [(0, flat)], lambda _offset, fragment: fragment)
    fragments.fill("g", torch.zeros(4), alone=True)
    fragments.fill("g", torch.zeros(4), alone=False)
    assert not fragments.filled_alone("g")


def test_fragments_not_handed_in_this_window_are_named():
    """A fragment remembered in an earlier accumulation window and not handed again in this one is named before
    the update reads it (the caller may have changed its copy without handing it); handing it again, storing over
    it or forgetting the group clears it."""
    flat = torch.ones(8)
    fragments = GradientFragments()
    fragments.remember("g", [(0, flat.narrow(0, 0, 4)), (4, flat.narrow(0, 4, 4))], _views_of(flat))
    assert fragments.not_handed_this_window("g") == []
    fragments.end_window()
    fragments.remember("g", [(0, flat.narrow(0, 0, 4))], _views_of(flat))  # offset 4 not handed this window
    assert fragments.not_handed_this_window("g") == [4]
    fragments.remember("g", [(4, torch.ones(4))], _views_of(flat))  # stored over: nothing remembered there
    assert fragments.not_handed_this_window("g") == []
    fragments.end_window()
    assert fragments.not_handed_this_window("g") == [0]
    fragments.forget("g")
    assert fragments.not_handed_this_window("g") == []


def test_copies_changed_without_being_handed_stay_named_until_handed_again():
    flat = torch.ones(8)
    fragments = GradientFragments()
    fragments.remember("g", [(0, flat.narrow(0, 0, 4)), (4, flat.narrow(0, 4, 4))], _views_of(flat))
    fragments.note_changed_unhanded("g", [4])
    assert fragments.changed_unhanded("g") == {4} and fragments.groups() == ["g"]
    fragments.remember("g", [(0, flat.narrow(0, 0, 4))], _views_of(flat))  # another offset handed: still changed
    assert fragments.changed_unhanded("g") == {4}
    fragments.remember("g", [(4, flat.narrow(0, 4, 4))], _views_of(flat))  # handed again: current
    assert fragments.changed_unhanded("g") == set()
    fragments.note_changed_unhanded("g", [0])
    fragments.clear()
    assert fragments.changed_unhanded("g") == set()


def test_a_fragment_not_handed_again_is_filled_with_each_factor_its_updates_scaled_it_by_since():
    """Stock CPU offload's gradient buffer keeps what each update's unscale and clip left in it; a parameter that gets
    no gradient in a later window is updated from those bytes. Fragments handed in this window are not scaled, nor
    one whose copy the caller changed without handing it (nothing of stock's to replay there)."""
    flat = torch.tensor([3.0, 5.0, 7.0, 11.0])
    fragments, a, b = GradientFragments(), flat.narrow(0, 0, 2), flat.narrow(0, 2, 2)
    fragments.remember("g", [(0, a), (2, b)], _views_of(flat))
    half, third = torch.tensor([0.5]), torch.tensor([1 / 3])
    fragments.scaled("g", half)  # window 0's update
    fragments.end_window()
    fragments.remember("g", [(2, b)], _views_of(flat))  # window 1: only b handed again
    gradient = torch.zeros(4)
    fragments.fill("g", gradient, alone=True)
    assert gradient.tolist() == [1.5, 2.5, 7.0, 11.0]
    fragments.scaled("g", third)
    fragments.end_window()
    fragments.fill("g", gradient, alone=True)  # window 2, nothing handed: each factor in turn, as stock's buffer
    expected = [(torch.tensor([x]) * half * third).item() for x in (3.0, 5.0)] + \
               [(torch.tensor([x]) * third).item() for x in (7.0, 11.0)]
    assert gradient.tolist() == expected
    fragments.note_changed_unhanded("g", [0])
    fragments.fill("g", gradient, alone=True)
    assert gradient.tolist()[:2] == [3.0, 5.0]



def test_a_fill_applies_a_bounded_number_of_factors_however_long_a_fragment_goes_unhanded():
    """After REPLAY_BEFORE_KEEPING factors the replayed product is kept as the fragment's bytes: later fills apply
    only the newer factors (in order, as stock's buffer got them), and no factor is kept longer than a fill may need
    it."""
    flat = torch.tensor([3.0, 5.0, 7.0, 11.0])
    fragments, a, b = GradientFragments(), flat.narrow(0, 0, 2), flat.narrow(0, 2, 2)
    fragments.scaled("g", torch.tensor([2.0]))  # nothing remembered yet: nothing to scale
    fragments.remember("g", [(0, a), (2, b)], _views_of(flat))
    expected, gradient = torch.tensor([3.0, 5.0]), torch.zeros(4)
    for window in range(3 * REPLAY_BEFORE_KEEPING):
        fragments.remember("g", [(2, b)], _views_of(flat))  # b handed in every window, a only in the first
        fragments.fill("g", gradient, alone=True)
        assert gradient[:2].tolist() == expected.tolist() and gradient[2:].tolist() == [7.0, 11.0], window
        factor = torch.tensor([0.9 - window / 100])
        fragments.scaled("g", factor)
        gradient.mul_(factor)  # the update scales what it was lent
        expected.mul_(factor)
        fragments.end_window()
        assert 1 <= fragments.factors_kept("g") <= REPLAY_BEFORE_KEEPING  # those a's next fill applies
    flat.fill_(1.0)  # a is handed again: its view is read again, and no factor is kept for it
    fragments.remember("g", [(0, a), (2, b)], _views_of(flat))
    fragments.end_window()
    assert fragments.factors_kept("g") == 0
    fragments.fill("g", gradient, alone=True)
    assert gradient.tolist() == [1.0, 1.0, 1.0, 1.0]
    fragments.forget("g")
    assert fragments.factors_kept("g") == 0


def test_a_read_between_steps_keeps_no_copy():
    """One factor to apply (a getter after the step, or a parameter unused for one window): the fill reads the
    caller's copy each time and keeps none of its own (keeping one at every fill copied the whole gradient at the
    fp32 gather after training, and two memory-limited engine tests were killed)."""
    flat = torch.tensor([3.0, 5.0])
    fragments, half = GradientFragments(), torch.tensor([0.5])
    fragments.remember("g", [(0, flat.narrow(0, 0, 2))], _views_of(flat))
    fragments.scaled("g", half)
    fragments.end_window()
    gradient = torch.zeros(2)
    fragments.fill("g", gradient, alone=True)
    assert gradient.tolist() == [1.5, 2.5]
    flat.add_(1)  # the next fill reads the caller's bytes again: no copy of the first fill's was kept
    fragments.fill("g", gradient, alone=True)
    assert gradient.tolist() == [2.0, 3.0]
