"""Gradient fragments remembered where they lie (cache/gradient_fragments.py, pure): only views of a host buffer of
the optimizer's dtype are remembered (anything else is returned for storing), the newest part per offset wins,
and a gradient filled from fragments alone has zeros where none lands."""
import torch

from tencache_ds.cache.gradient_fragments import GradientFragments, lies_in_kept_buffer


def test_only_views_of_a_host_buffer_of_the_optimizers_dtype_are_remembered():
    flat = torch.arange(10, dtype=torch.float32)
    assert lies_in_kept_buffer(flat.narrow(0, 2, 3), torch.float32)
    assert not lies_in_kept_buffer(flat.narrow(0, 2, 3).clone(), torch.float32)  # its own allocation
    assert not lies_in_kept_buffer(flat.to(torch.bfloat16).narrow(0, 0, 2), torch.float32)  # another dtype


def test_a_gradient_filled_from_fragments_alone_has_zeros_between_them_and_reads_their_newest_bytes():
    flat = torch.arange(1.0, 11.0)  # stage 3's buffer: 10 elements, two parameters' partitions of 3 and 4
    fragments = GradientFragments(torch.float32)
    assert fragments.remember("g", [(1, flat.narrow(0, 0, 3)), (6, flat.narrow(0, 3, 4))]) == []
    flat.mul_(2)  # the buffer changes before the update (a later backward of the same window): the newest wins
    gradient = torch.full((12,), -1.0)
    fragments.fill("g", gradient, alone=True)
    assert gradient.tolist() == [0, 2, 4, 6, 0, 0, 8, 10, 12, 14, 0, 0]
    assert fragments.filled_alone("g") and not fragments.filled_alone("g")  # asked once


def test_a_stored_part_replaces_the_fragment_remembered_at_its_offset_and_fills_over_stored_bytes():
    flat = torch.ones(8)
    fragments = GradientFragments(torch.float32)
    fragments.remember("g", [(0, flat.narrow(0, 0, 4)), (4, flat.narrow(0, 4, 4))])
    cast = torch.full((4,), 5.0, dtype=torch.bfloat16).to(torch.float32)  # its own allocation: stored
    stored = fragments.remember("g", [(4, cast)])
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
    fragments = GradientFragments(torch.float32)
    fragments.remember("g", [(0, flat)])
    fragments.fill("g", torch.zeros(4), alone=True)
    fragments.fill("g", torch.zeros(4), alone=False)
    assert not fragments.filled_alone("g")
