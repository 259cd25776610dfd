"""ReusedScratch (memory/reused_scratch.py): views of one buffer that grows to the largest request up to its ceiling,
starts every view at the buffer's first element, and is replaced for another dtype; release drops it."""
import torch

from tencache_ds.memory.reused_scratch import ReusedScratch

CPU = torch.device("cpu")


def test_smaller_requests_reuse_the_buffer_larger_ones_replace_it():
    scratch = ReusedScratch(1 << 20)
    first = scratch.view(1000, torch.float64, CPU)
    second = scratch.view(10, torch.float64, CPU)
    assert second.data_ptr() == first.data_ptr()  # the same memory, from its first element
    assert (first.numel(), second.numel()) == (1000, 10)
    assert second.is_contiguous() and second.dtype == torch.float64
    larger = scratch.view(5000, torch.float64, CPU)
    assert larger.numel() == 5000
    assert (scratch.views, scratch.grows) == (3, 2)
    assert scratch.peak_bytes == scratch.held_bytes == 5000 * 8


def test_another_dtype_gets_a_buffer_of_its_own():
    scratch = ReusedScratch(1 << 20)
    scratch.view(100, torch.float64, CPU)
    view = scratch.view(100, torch.float32, CPU)
    assert view.dtype == torch.float32 and scratch.grows == 2
    assert scratch.held_bytes == 400


def test_release_lets_the_buffer_go_and_the_next_view_allocates_again():
    scratch = ReusedScratch(1 << 20)
    scratch.view(100, torch.float64, CPU)
    scratch.release()
    assert scratch.held_bytes == 0 and scratch.peak_bytes == 800
    scratch.view(50, torch.float64, CPU)
    assert scratch.grows == 2 and scratch.held_bytes == 400


def test_a_copy_above_the_ceiling_gets_no_view_and_leaves_the_buffer_as_it_was():
    scratch = ReusedScratch(8000)
    first = scratch.view(1000, torch.float64, CPU)  # 8000 bytes: at the ceiling, served
    assert first is not None
    assert scratch.view(1001, torch.float64, CPU) is None  # 8008 bytes
    assert scratch.view(2001, torch.float32, CPU) is None  # 8004 bytes
    assert (scratch.views, scratch.refused, scratch.grows) == (1, 2, 1)
    assert scratch.held_bytes == 8000
    assert scratch.view(10, torch.float64, CPU).data_ptr() == first.data_ptr()


def test_the_expected_largest_copy_is_allocated_at_the_first_view_so_a_growing_run_takes_one_buffer():
    scratch = ReusedScratch(8000, largest_numel=900)
    first = scratch.view(100, torch.float64, CPU)
    later = scratch.view(900, torch.float64, CPU)  # the largest, coming last: no new buffer
    assert later.data_ptr() == first.data_ptr() and scratch.grows == 1 and scratch.held_bytes == 7200
    # an expectation above the ceiling is not allocated: the buffer is the request's size
    above = ReusedScratch(8000, largest_numel=5000)
    assert above.view(100, torch.float64, CPU).numel() == 100 and above.held_bytes == 800
