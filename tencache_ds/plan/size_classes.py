"""Size classes for the pinned arena. Owns: tensor-size histogram -> slot sizes and slot counts. Pure.

Stock DeepSpeed gives every swapped partition a slot as large as the largest one (`buffer_count x buffer_size`):
for GPT-2-small in bf16 that is 5 x 77 MiB for partitions that are mostly 1-5 MiB. Here each distinct
(4 KiB-rounded) partition size is its own class, so a slot wastes at most the 4 KiB rounding, and each class gets
as many slots as the same number of partitions of *that* size need.
"""
from typing import Dict

from ..units import arena_page_bytes, round_up

# Classes whose sizes differ by less than this factor are merged into the larger one: a model with many nearly
# equal sizes (ragged vocabularies, odd head counts) then gets a handful of classes, each slot wasting < 12.5%.
MERGE_RATIO = 1.125
MAX_CLASSES = 32


def size_histogram(nbytes_list) -> Dict[int, int]:
    """Page-rounded byte size -> number of tensors of that size, e.g. [5000, 8000, 100] -> {8192: 2, 4096: 1}
    (in the arena's pages: units.arena_page_bytes)."""
    histogram: Dict[int, int] = {}
    page = arena_page_bytes()
    for nbytes in nbytes_list:
        size = round_up(max(int(nbytes), 1), page)
        histogram[size] = histogram.get(size, 0) + 1
    return histogram


def snap_to_classes(histogram: Dict[int, int], classes, ratio: float = MERGE_RATIO) -> Dict[int, int]:
    """Each size of ``histogram`` as the smallest of ``classes`` (slot sizes an earlier plan made) that holds it
    within ``ratio``, else as itself. A later plan's size between one an earlier plan merged away and the class it
    merged into got a class of its own, which then became the merged-away size's own class too (the smallest that
    fits): those tensors stopped using the slots planned for them (helper-211). E.g. {4096000: 1} with a class of
    4505600 -> {4505600: 1}."""
    snapped: Dict[int, int] = {}
    for size, count in histogram.items():
        target = min((kept for kept in classes if size <= kept <= size * ratio), default=size)
        snapped[target] = snapped.get(target, 0) + count
    return snapped


def merge_close_classes(histogram: Dict[int, int], ratio: float = MERGE_RATIO,
                        max_classes: int = MAX_CLASSES) -> Dict[int, int]:
    """Fold each size into the next larger kept size when that one is within ``ratio`` of it, then, if more than
    ``max_classes`` remain, fold the pair with the smallest size ratio until they fit. Counts are summed, so
    every tensor still has a class at least its size. E.g. {4096: 1, 4300->8192: 1, 1 MiB: 3} keeps 3 classes."""
    sizes = sorted(histogram)
    merged: Dict[int, int] = {}
    for size in reversed(sizes):  # largest first: a size joins the smallest kept class that is close enough
        target = min((kept for kept in merged if kept <= size * ratio), default=None)
        key = target if target is not None else size
        merged[key] = merged.get(key, 0) + histogram[size]
    while len(merged) > max_classes:
        ordered = sorted(merged)
        smaller, larger = min(zip(ordered, ordered[1:]), key=lambda pair: pair[1] / pair[0])
        merged[larger] += merged.pop(smaller)
    return dict(sorted(merged.items()))


def streaming_slot_counts(histogram: Dict[int, int], slots_per_class: int) -> Dict[int, int]:
    """Slots per class for streaming: as many partitions of each size may be resident at once as stock DeepSpeed
    allows in total (``buffer_count``), but never more than the model has of that size.

    E.g. GPT-2-small bf16 with buffer_count 5: {77 MiB embedding: 1, 4.5 MiB MLP: 5, 3.4 MiB qkv: 5, ...}
    instead of 5 x 77 MiB."""
    if slots_per_class < 1:
        raise ValueError(f"slots_per_class must be >= 1, got {slots_per_class}")
    return {size: min(count, slots_per_class) for size, count in histogram.items()}


def class_bytes(class_counts: Dict[int, int]) -> int:
    """Total bytes reserved by ``class_counts``."""
    return sum(size * count for size, count in class_counts.items())


def cache_slot_counts(histogram: Dict[int, int], streaming: Dict[int, int], budget_bytes: int) -> Dict[int, int]:
    """Extra slots that keep clean copies of tensors in host memory, within ``budget_bytes``.

    Every class gets the same fraction of the tensors streaming slots do not already cover, so the cache holds
    the same share of each size (10Cache's size-distribution-proportional pools, paper digest 5.2); budget left
    by rounding down buys single slots, smallest classes first. E.g. {4 MiB: 10, 1 MiB: 10}, streaming 2 each,
    budget 20 MiB -> 0.5 of the rest: {4 MiB: 4, 1 MiB: 4}, then 0 MiB left.
    """
    remaining = {size: count - streaming.get(size, 0) for size, count in histogram.items()}
    remaining = {size: count for size, count in remaining.items() if count > 0}
    wanted_bytes = class_bytes(remaining)
    if budget_bytes <= 0 or wanted_bytes == 0:
        return {}
    fraction = min(1.0, budget_bytes / wanted_bytes)
    counts = {size: int(count * fraction) for size, count in remaining.items()}
    left = budget_bytes - class_bytes(counts)
    for size in sorted(remaining):
        while counts[size] < remaining[size] and size <= left:
            counts[size] += 1
            left -= size
    return {size: count for size, count in counts.items() if count > 0}
