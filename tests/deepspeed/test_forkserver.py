"""The suite's fork server (forkserver.py, conftest's _ForkServer) behaves as a fresh interpreter would for the
runs it serves: a run that outlives its timeout is killed with its process group and fails its test, and the
server goes on serving; a stock reference forked from it never imported tencache_ds; a forked run and a fresh one
compute with the same threads and give the same bits."""
import os

import pytest

pytestmark = [pytest.mark.deepspeed]


def test_a_forked_run_past_its_timeout_is_killed_and_the_server_serves_the_next(train, fork_server):
    if not fork_server.enabled:
        pytest.skip("TENCACHE_TEST_FORKSERVER=0: every run starts a fresh interpreter")
    with pytest.raises(pytest.fail.Exception, match="hung: no end after 3 s"):
        train(block={}, steps=200, timeout=3)
    stock = train(block=None, steps=1, seq_len=16, label="after-a-killed-run")  # a label no other test asks for
    assert fork_server._proc is not None and fork_server._proc.poll() is None
    assert stock.result["tencache_imported"] is False
    assert len(stock.loss_bits) == 1


def test_forked_and_fresh_runs_compute_with_the_suites_one_thread(train, fork_server):
    """tests/conftest.py gives every process the suite starts one OpenMP thread (with two, forked runs computed
    other last bits now and then on an Intel Xeon: docs/reliability.md). A run forked from the server and one in a
    fresh interpreter (an environment variable the server was not started with) both compute with it."""
    if not fork_server.enabled:
        pytest.skip("TENCACHE_TEST_FORKSERVER=0: every run starts a fresh interpreter")
    threads = int(os.environ["OMP_NUM_THREADS"])  # set by tests/conftest.py unless the developer exported it
    forked = train(block=None, steps=1, seq_len=16, label="threads-forked")
    fresh = train(block=None, steps=1, seq_len=16, label="threads-fresh", env={"TEST_FRESH_INTERPRETER": "1"})
    assert forked.result["compute"]["num_threads"] == fresh.result["compute"]["num_threads"] == threads
    assert forked.loss_bits == fresh.loss_bits
