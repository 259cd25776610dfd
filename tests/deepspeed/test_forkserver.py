"""The suite's fork server (forkserver.py, conftest's _ForkServer) behaves as a fresh interpreter would for the
runs it serves: a run that outlives its timeout is killed with its process group and fails its test, and the
server goes on serving; a stock reference forked from it never imported tencache_ds."""
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
