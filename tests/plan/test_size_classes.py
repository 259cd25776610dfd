"""Size classes from a tensor-size histogram."""
import random

from tencache_ds.plan.size_classes import (MERGE_RATIO, class_bytes, merge_close_classes, size_histogram,
                                           streaming_slot_counts)


def test_histogram_rounds_to_pages():
    assert size_histogram([5000, 8000, 100, 4096]) == {8192: 2, 4096: 2}


def test_gpt2_small_like_model_needs_far_less_than_stock():
    """GPT-2-small bf16 partitions: one 77 MiB embedding, 24 x 4.5 MiB MLP, 12 x 3.4 MiB qkv, 12 x 1.1 MiB proj."""
    sizes = [50257 * 768 * 2] + [768 * 3072 * 2] * 24 + [768 * 2304 * 2] * 12 + [768 * 768 * 2] * 12
    counts = streaming_slot_counts(merge_close_classes(size_histogram(sizes)), slots_per_class=5)
    stock = 5 * round(50257 * 768 * 2)
    assert counts[max(counts)] == 1            # one embedding slot, not five
    assert class_bytes(counts) < 0.35 * stock  # stock: buffer_count x largest


def test_merge_bounds_waste_and_keeps_every_tensor_covered():
    rng = random.Random(7)
    sizes = [rng.randrange(1, 64 << 20) for _ in range(500)]
    histogram = size_histogram(sizes)
    merged = merge_close_classes(histogram)
    assert sum(merged.values()) == sum(histogram.values())
    assert len(merged) <= 32
    classes = sorted(merged)
    for size in histogram:  # every size has a class at least as large
        assert any(c >= size for c in classes)


def test_merge_within_ratio_only():
    histogram = {100 * 4096: 3, 105 * 4096: 2, 200 * 4096: 1}
    merged = merge_close_classes(histogram)
    assert merged == {105 * 4096: 5, 200 * 4096: 1}
    assert 105 / 100 < MERGE_RATIO < 200 / 105


def test_streaming_counts_never_exceed_the_model():
    assert streaming_slot_counts({4096: 2, 8192: 40}, 5) == {4096: 2, 8192: 5}


def test_a_size_snaps_to_the_smallest_earlier_class_that_holds_it_within_the_ratio():
    from tencache_ds.plan.size_classes import snap_to_classes
    assert snap_to_classes({4096000: 2, 8192: 1}, [4505600, 4300800]) == {4300800: 2, 8192: 1}
    assert snap_to_classes({4096000: 1}, [4096000 * 2]) == {4096000: 1}  # too far: its own class
    assert snap_to_classes({4096000: 1}, []) == {4096000: 1}
