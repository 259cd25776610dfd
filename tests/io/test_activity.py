"""How busy tencache keeps the drive: the activity tracker's arithmetic on a fake clock, and real requests of the
I/O engine counted while they execute."""
import torch

from tencache_ds.io.activity import IoActivity
from tencache_ds.io.direct_io import DirectFileIO


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_overlapping_requests_count_once_for_busy_time_and_twice_for_depth():
    """One request from t=0 to 2, another from t=1 to 3, then idle until t=5: busy 3 s, depth-seconds 4."""
    clock = Clock()
    activity = IoActivity(clock)
    activity.started()
    clock.now = 1.0
    activity.started()
    clock.now = 2.0
    activity.finished()
    clock.now = 3.0
    activity.finished()
    clock.now = 5.0
    assert activity.totals() == (3.0, 4.0)


def test_a_request_still_executing_counts_up_to_now():
    clock = Clock()
    activity = IoActivity(clock)
    activity.started()
    clock.now = 1.5
    assert activity.totals() == (1.5, 1.5)


def test_the_engine_counts_its_requests_while_they_execute_and_failed_ones_too(tmp_path):
    activity = IoActivity()
    io = DirectFileIO(num_threads=2, activity=activity)
    try:
        buffer = torch.ones(4 << 20, dtype=torch.uint8)
        io.write(buffer, str(tmp_path / "a.swp")).result()
        busy, depth = activity.totals()
        assert busy > 0 and depth >= busy
        failed = io.read(buffer, str(tmp_path / "missing.swp"))
        assert failed.exception() is not None
        activity.started()  # the failed request left the depth at 0 (finished in a finally): one more is depth 1
        first = activity.totals()
        second = activity.totals()
        assert second[1] - first[1] == second[0] - first[0]
    finally:
        io.close()
