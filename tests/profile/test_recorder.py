"""The step recorder: steps cut at end_step, each access's size and time, read durations issue->completion, I/O
waits kept apart from compute, and the one-comparison-per-access divergence check. A fake clock; real futures."""
from concurrent.futures import Future

import pytest

from tencache_ds.profile import recorder as recorder_module
from tencache_ds.profile.recorder import StepRecorder


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def finished(future_result=None, error=None):
    future = Future()
    if error is None:
        future.set_result(future_result)
    else:
        future.set_exception(error)
    return future


def test_steps_are_cut_at_end_step_with_order_and_sizes():
    recorder = StepRecorder()
    assert recorder.end_step() is None  # nothing happened
    for key, size in (("a", 10), ("b", 20), ("c", 30)):
        recorder.touch(key, size)
    assert recorder.position == 3
    step = recorder.end_step()
    assert step.keys == ("a", "b", "c") and step.nbytes == (10, 20, 30)
    assert recorder.position == 0 and recorder.end_step() is None


def test_offsets_reads_and_stalls_give_compute_between_accesses():
    """A demand-fetched step: compute 1 s, access a (its read takes 0.5 s and the program waits for it), compute
    2 s, access b (a hit), compute 0.25 s, end."""
    clock = FakeClock()
    recorder = StepRecorder(clock=clock)
    clock.advance(1.0)
    index = recorder.touch("a", 4096)
    timer = recorder.read_timer(index)  # the read is issued now
    clock.advance(0.5)
    timer(finished())                   # ... and completes 0.5 s later
    recorder.stalled(0.5)               # the program waited for it
    clock.advance(2.0)
    recorder.touch("b", 8192)
    clock.advance(0.25)
    step = recorder.end_step()
    assert step.offset_s == (1.0, 3.5) and step.read_s == (0.5, None)
    assert step.stall_s == (0.0, 0.5, 0.0) and step.step_s == 3.75
    assert step.gap_compute_s() == [1.0, 2.0, 0.25] and step.compute_s == 3.25
    assert step.read_bytes == 4096 and step.measured_read_bytes_per_s == 8192


def test_a_failed_read_and_a_read_finishing_after_its_step_are_not_timed():
    clock = FakeClock()
    recorder = StepRecorder(clock=clock)
    failing = recorder.read_timer(recorder.touch("a"))
    late = recorder.read_timer(recorder.touch("b"))
    failing(finished(error=OSError("EIO")))
    first = recorder.end_step()
    late(finished())  # completes in the next step: dropped, not written into that step
    recorder.touch("c")
    second = recorder.end_step()
    assert first.read_s == (None, None) and second.read_s == (None,)


def test_divergence_is_detected_at_the_first_differing_access_and_reset_by_end_step():
    recorder = StepRecorder()
    seen = []
    recorder.expect(["a", "b", "c"], seen.append)
    recorder.touch("a")
    recorder.touch("b")
    assert recorder.on_track
    recorder.touch("x")  # an eval pass, say
    recorder.touch("c")
    assert not recorder.on_track and recorder.diverged_at == 2 and seen == [2]  # reported once
    recorder.end_step()
    assert recorder.on_track  # the expectation stays for the next step
    for key in "abc":
        recorder.touch(key)
    assert recorder.on_track
    recorder.touch("a")  # past the end of the expected step
    assert not recorder.on_track and seen == [2, 3]


def test_without_an_expectation_every_access_is_on_track():
    recorder = StepRecorder()
    recorder.touch("anything")
    assert recorder.on_track


def test_recorder_gives_up_on_endless_steps(monkeypatch):
    monkeypatch.setattr(recorder_module, "MAX_STEP_ACCESSES", 3)
    recorder = StepRecorder()
    for key in range(5):
        recorder.touch(key, 1)
    recorder.stalled(1.0)  # no gap to put it in any more: ignored, not an error
    assert recorder.position == 5 and recorder.end_step() is None
    recorder.touch("next")
    assert recorder.end_step().keys == ("next",)


@pytest.mark.parametrize("stall_after", [0, 1, 2])
def test_a_stall_lands_in_the_gap_it_happened_in(stall_after):
    recorder = StepRecorder()
    for key in range(stall_after):
        recorder.touch(key)
    recorder.stalled(0.25)
    for key in range(stall_after, 2):
        recorder.touch(key)
    stalls = [0.0, 0.0, 0.0]
    stalls[stall_after] = 0.25
    assert recorder.end_step().stall_s == tuple(stalls)
