"""Nothing left behind: DeepSpeed's shared-memory all-reduce buffers (69 MB of RAM per rank, scripts/shm_buffers.py)
are gone once a launched run of scripts/train.py ends, whether it finished or was killed mid-run. The train fixture
removes a run's leftovers itself and reports them: each test asserts that there were none to remove."""
import pytest

from conftest import TWO_RANK_LAUNCH

pytestmark = pytest.mark.deepspeed


def test_a_two_rank_run_leaves_no_allreduce_buffer(train):
    # Two ranks: each maps the other's buffer by name, so a rank may unlink its own only once the other has
    # mapped it (a rank that found its peer's name gone would wait for it forever). The suite's one launch of two
    # ranks through the launcher (test_forkserver.py compares forked ranks with it).
    run = train(**TWO_RANK_LAUNCH)
    assert run.result["world_size"] == 2
    assert run.shm_leftovers == []


def test_a_killed_run_leaves_no_allreduce_buffer(train):
    # a rank forked as the launcher starts it (LOCAL_SIZE set: it makes a buffer), killed after its first step
    run = train(block=None, launcher="ranks", dtype="fp32", steps=2, kill_after_step=0, expect_failure=True)
    assert "killing this process" in run.output
    assert run.shm_leftovers == []
