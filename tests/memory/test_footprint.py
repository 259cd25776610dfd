"""StepRiseMeter (memory/footprint.py) on this process's real resident set: a step that allocates and frees
memory shows its rise, also where one stretch of it allocates and the next frees; memory a step leaves allocated is
not a rise; memory given back lowers the level the next rise is measured from, inside a span too; the sampling
thread ends with the meter."""
import gc
import time

import torch

from tencache_ds.memory.footprint import StepRiseMeter

MiB = 1 << 20


def touch(nbytes):
    """Resident memory: zero-filled pages that are written (an empty tensor's pages would stay untouched)."""
    tensor = torch.empty(nbytes, dtype=torch.uint8)
    tensor.fill_(1)
    return tensor


def test_a_step_that_frees_its_temporaries_rises_by_them():
    meter = StepRiseMeter()
    try:
        assert meter.boundary() is None  # the first boundary has no step before it
        temporaries = touch(256 * MiB)
        time.sleep(0.1)  # a step lasts far longer than the sampling interval
        del temporaries
        rise = meter.boundary()
        assert 200 * MiB < rise < 400 * MiB, rise
        assert meter.boundary() < 64 * MiB  # a step that allocates nothing
    finally:
        meter.close()


def test_memory_a_step_keeps_is_its_new_level_not_a_rise():
    meter = StepRiseMeter()
    try:
        meter.boundary()
        kept = touch(256 * MiB)  # e.g. a cache filling: the next step starts from here
        time.sleep(0.1)
        assert meter.boundary() < 64 * MiB
        more = touch(256 * MiB)  # and a budget filled in the update, over a span
        time.sleep(0.1)
        assert meter.boundary(ends_span=True) < 64 * MiB
        del kept, more
    finally:
        meter.close()


def test_memory_one_stretch_leaves_and_the_next_frees_is_the_steps_rise():
    """The backward leaves memory allocated until the update has begun (at 2 ranks, gpt2-1.3b: 1.9 of its 2.6 GiB),
    and the update frees it: neither stretch shows it, the step does."""
    meter = StepRiseMeter()
    try:
        assert meter.boundary(ends_span=True) is None  # a step's first forward pass: the span begins
        left = touch(256 * MiB)  # the backward
        time.sleep(0.1)
        assert meter.boundary() < 64 * MiB  # the update begins: to the stretch, a new level
        del left  # the update frees it
        time.sleep(0.1)
        rise = meter.boundary(ends_span=True)  # the next step's first forward pass
        assert 200 * MiB < rise < 400 * MiB, rise
        assert meter.boundary(ends_span=True) < 64 * MiB  # a step that allocates nothing
    finally:
        meter.close()


def test_a_step_after_memory_was_given_back_rises_from_the_level_after_it():
    """The host tier gives memory back right after a reading's boundary: the next step's rise is measured from the
    level it starts at, not from the one before the give-back, which would hide up to the bytes given back."""
    meter = StepRiseMeter()
    try:
        meter.boundary(ends_span=True)
        held = touch(256 * MiB)  # the tier's memory
        time.sleep(0.1)
        meter.boundary(ends_span=True)  # a reading: the tier gives it back at once
        del held
        meter.rebase()
        temporaries = touch(128 * MiB)  # the next step
        time.sleep(0.1)
        del temporaries
        rise = meter.boundary(ends_span=True)
        assert 100 * MiB < rise < 200 * MiB, rise
    finally:
        meter.close()


def test_a_give_back_inside_a_span_lowers_the_level_the_span_is_measured_from():
    """Gradient accumulation: the governor reads at every forward pass, and a reading that is not a step's first
    (no span ends there) can give memory back too. The span's start is lowered with it, so that what the backward
    left allocated, and the update's temporaries, still count as the step's rise; measured against the level
    before the give-back they hid behind the bytes given back. A scripted resident set and samples taken by hand
    (the sampling thread waits an hour): the arithmetic, not the sampler's timing, is under test."""
    resident = [1024 * MiB + 256 * MiB]  # the process, and the tier's 256 MiB
    meter = StepRiseMeter(read_resident=lambda: resident[0], interval_s=3600)
    try:
        meter.boundary(ends_span=True)  # the step's first forward pass: the span begins
        resident[0] += 128 * MiB  # the first backward, left allocated until the update
        meter._take_sample()
        assert meter.boundary() == 0  # the second forward pass: a reading inside the span, a new level
        resident[0] -= 256 * MiB  # ... gives the tier's memory back
        meter.rebase()
        resident[0] += 64 * MiB  # the update's temporaries, beside what the backward left
        meter._take_sample()
        resident[0] -= 192 * MiB  # it frees both
        # above the level the give-back left; the span unlowered gave 128 MiB (its start and peak both before the
        # give-back), the stretch alone 64
        assert meter.boundary(ends_span=True) == 192 * MiB  # the next step's first forward pass
    finally:
        meter.close()


def test_the_thread_ends_at_close_and_with_an_unclosed_meter():
    meter = StepRiseMeter()
    assert meter.running
    meter.close()
    meter.close()  # idempotent
    assert not meter.running and meter.boundary() is None
    forgotten = StepRiseMeter()
    thread = forgotten._thread
    del forgotten
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()
