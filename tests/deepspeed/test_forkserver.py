"""The suite's fork server (forkserver.py, conftest's _ForkServer) behaves as a fresh interpreter would for the
runs it serves: a run that outlives its timeout is killed with its process group and fails its test, and the
server goes on serving; a stock reference forked from it never imported tencache_ds; a forked run and a fresh one
compute with the same threads; ranks forked as DeepSpeed's launcher starts them get its environment and
arguments, give its bits, and a rank that fails ends the launch with its status, without a hang."""
import json
import os
import sys
import textwrap

import pytest

from conftest import REPO, TWO_RANK_LAUNCH, free_port

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


def test_forked_ranks_compute_with_the_suites_one_thread_and_give_the_launchers_bits(train, fork_server):
    """tests/conftest.py gives every process the suite starts one OpenMP thread (with two, forked runs computed
    other last bits now and then on an Intel Xeon: docs/reliability.md). Ranks forked from the server and the ranks
    the launcher starts in fresh interpreters both compute with it, and give the same bits."""
    if not fork_server.enabled:
        pytest.skip("TENCACHE_TEST_FORKSERVER=0: every run starts a fresh interpreter")
    threads = int(os.environ["OMP_NUM_THREADS"])  # set by tests/conftest.py unless the developer exported it
    launched, forked = train(**TWO_RANK_LAUNCH), train(**dict(TWO_RANK_LAUNCH, launcher="ranks"))
    assert launched.result["compute"]["num_threads"] == forked.result["compute"]["num_threads"] == threads
    assert launched.result["world_size"] == forked.result["world_size"] == 2
    assert forked.loss_bits == launched.loss_bits and len(forked.loss_bits) == 2
    assert forked.result["weights_sha256"] == launched.result["weights_sha256"] is not None


RANKS_SCRIPT = """
    import json, os, signal, sys, time
    print("RANK_ENV " + json.dumps({"argv": sys.argv[1:], "env": {key: os.environ.get(key) for key in (
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT", "CROSS_RANK", "CROSS_SIZE")}}))
    if os.environ["RANK"] == "1":
        sys.exit(3)

    def terminated(*_):
        print("RANK0_SIGTERM", flush=True)
        os._exit(143)

    signal.signal(signal.SIGTERM, terminated)
    time.sleep(120)  # as a rank waiting in a collective for the one that failed
"""


def test_a_failed_forked_rank_ends_the_others_and_the_launch_takes_its_status(tmp_path, fork_server):
    if not fork_server.enabled:
        pytest.skip("TENCACHE_TEST_FORKSERVER=0: every run starts a fresh interpreter")
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(RANKS_SCRIPT))
    port = free_port()
    # the run's timeout (60 s, counted from the launch's start) is half of rank 0's sleep: a launch that did not end
    # rank 0 fails the test as hung; ended by SIGTERM, as the launcher ends it (SIGKILL only 30 s later)
    done = fork_server.run(["--flag", "value"], dict(os.environ, PYTHONPATH=REPO), 60, str(tmp_path / "out"),
                           [sys.executable, script], script=str(script), ranks=2, master_port=port)
    assert done.returncode == 3 and "RANK0_SIGTERM" in done.stdout, done
    seen = sorted((json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()
                   if line.startswith("RANK_ENV ")), key=lambda rank: rank["env"]["RANK"])
    assert [rank["argv"] for rank in seen] == [["--local_rank=0", "--flag", "value"],
                                               ["--local_rank=1", "--flag", "value"]]
    for rank, seen_by in enumerate(seen):  # what deepspeed/launcher/launch.py sets on one node
        assert seen_by["env"] == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_SIZE": "2",
                                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "CROSS_RANK": "0",
                                  "CROSS_SIZE": "1"}
