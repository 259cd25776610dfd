"""Ranks agree by construction (integrations/deepspeed/agreement.py): which parameters the device tier keeps decides
which all-gathers run, so a tier that followed each rank's own budget would desynchronise the collectives (gloo
aborts with "Received data size doesn't match expected size", NCCL hangs). Two ranks, one of them given far smaller
budgets on purpose: the run finishes, with the bits of stock CPU offload (stock NVMe crashes at 2 ranks with
parameters on NVMe), and the device tier gathers each parameter once per optimizer step. The ranks are forked as the
launcher starts them (tests/deepspeed/forkserver.py), except the first test's unequal run: through the launcher."""
import json
import os

import pytest

from conftest import launch_ranks
from test_parity import assert_same_bits
from test_residency import FAST  # fp32 (why: there)

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]

RANK_BUDGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_budgets.py")
TWO_RANKS = dict(FAST, launcher="ranks", num_ranks=2, grad_accum=2, steps=3, seq_len=32, micro_batch=1)
# rank 1 only: a device tier that holds a few parameters, a host tier smaller than the model's partitions
SMALL_ON_RANK_1 = {"device_cache_bytes": "4MB", "host_cache_bytes": "20MB"}


def test_ranks_with_different_budgets_agree_and_give_stock_cpu_offloads_bits(train, tmp_path):
    """With an evaluation pass every other step (the traced sequence changes, and the tier keeps its residents
    through it), and rank 1's host tier too small for the model (its file I/O differs from rank 0's)."""
    options = dict(TWO_RANKS, steps=4, eval_every=2)
    reference = train(block=None, offload_device="cpu", **options)
    options["launcher"] = "deepspeed"  # the unequal ranks through the launcher itself, with a timeout
    unequal = train(block={"metrics_path": str(tmp_path / "metrics.jsonl")}, script=RANK_BUDGETS,
                    env={"TENCACHE_TEST_RANK1_BLOCK": json.dumps(SMALL_ON_RANK_1)}, timeout=600, **options)
    assert_same_bits(reference, unequal)
    assert unequal.result["steps"][1].get("eval_loss_bits") is not None
    stats = unequal.last_stats  # rank 0's: it was given "auto", yet holds no more than rank 1's 4 MB
    assert stats["device_tier_applicable"] == 1
    assert 0 < stats["device_cache_budget_bytes"] <= 4_000_000
    assert stats["device_tier_evicted"] > 0
    # gradients accumulated over 2 micro-batches, each partitioned at once at 2 ranks (one_rank_reduce.py)
    assert stats["gradients_partitioned_at_once"] > 0


def test_ranks_with_different_host_tiers_and_no_device_tier_gather_alike(train):
    """With the device tier off every module's parameters are gathered, through DeepSpeed's NVMe prefetch, whose
    depth the swapper decides: ranks whose host tiers differ (rank 1 streams every partition, rank 0 holds them all)
    must still take the same parameters into each all-gather. Before, rank 1's own reads ahead counted as buffers
    in use and gloo aborted in the first steps ("Received data size doesn't match expected size"). The weights are
    read through DeepSpeed's public API (a collective swap-in per parameter), the ranks' tiers unequal."""
    options = dict(TWO_RANKS, steps=3, weights_gather="public")
    reference = train(block=None, offload_device="cpu", **options)
    unequal = train(block={"device_cache_bytes": 0}, script=RANK_BUDGETS,
                    env={"TENCACHE_TEST_RANK1_BLOCK": json.dumps({"host_cache_bytes": 0})}, timeout=600, **options)
    assert_same_bits(reference, unequal)
    # the ranks did differ (helper-227): rank 1 read its partitions from file, rank 0 held every one
    with open(unequal.result_path + ".rank1") as handle:
        rank1 = json.load(handle)
    rank0 = unequal.last_stats
    assert rank1["host_cache_budget_bytes"] == 0 < rank0["host_cache_budget_bytes"], (rank1, rank0)
    assert rank1["param_nvme_read_bytes"] > rank0["param_nvme_read_bytes"], (rank1, rank0)


def test_two_ranks_gather_each_parameter_once_per_optimizer_step(train, tmp_path):
    """With a device budget that holds the model, the bytes gathered per step do not grow with gradient
    accumulation: every parameter is gathered at its first use after the update, and every other use of the step
    (the forward and backward of each micro-batch) is served from the tier."""
    fetched = {}
    for grad_accum in (1, 4):
        metrics = tmp_path / f"gas{grad_accum}.jsonl"
        run = train(block={"metrics_path": str(metrics)}, **dict(TWO_RANKS, grad_accum=grad_accum))
        if grad_accum == 4:  # kept across micro-batches, partition slots given back: the bits do not move
            assert_same_bits(train(block=None, offload_device="cpu", **dict(TWO_RANKS, grad_accum=4)), run)
        lines = [json.loads(line) for line in metrics.read_text().splitlines()]
        fetched[grad_accum] = lines[-1]["device_fetch_bytes"]
        # the update makes every gathered copy stale: each parameter is gathered exactly once a step, DeepSpeed's
        # prefetches included (counted at the use, a prefetched parameter looked like a hit that moved nothing), in
        # its own dtype (counted in its swapped-out partition's, an fp32 parameter on NVMe was half its bytes)
        assert fetched[grad_accum] == run.result["num_params"] * 4  # fp32
        assert lines[-1]["device_hit_rate"] > 0.5
        # the tier holds parameters from their first use to the update, which releases them (stale): the step's
        # end shows 0 B, its peak what the step held
        assert lines[-1]["device_cache_peak_bytes"] > lines[-1]["device_cache_bytes_in_use"] == 0
        assert run.last_stats["device_tier_applicable"] == 1
        assert lines[-1]["device_gathers"] > 0
    assert 0 < fetched[4] <= 1.05 * fetched[1]


NODE_COUNT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node_count.py")


def test_ranks_on_a_node_are_counted_where_the_launcher_says_nothing(train):
    """Regression (helper-184's review): a launch that sets WORLD_SIZE and nothing of the node took every rank of
    the job for this node's, so on several nodes the memory governor's reserve counted every node's step rises
    (it gave back the whole host tier and stopped runs that fit). The ranks now count themselves on their node
    (node_ranks.py): two ranks of one node 2, two ranks on nodes of their own 1 each; with stock CPU offload's bits
    either way."""
    options = dict(TWO_RANKS, steps=2)
    reference = train(block=None, offload_device="cpu", **options)
    # ... and where WORLD_SIZE is gone too (torch.distributed initialised by the script itself: helper-188)
    for split, no_world_size, local in (("0", "0", 2), ("1", "0", 1), ("0", "1", 2)):
        run = train(block={}, script=NODE_COUNT, **options,
                    env={"TENCACHE_TEST_SPLIT_NODES": split, "TENCACHE_TEST_NO_WORLD_SIZE": no_world_size})
        for rank in (0, 1):
            assert f"NODE_RANKS rank={rank} local={local} known=True" in run.output, run.output[-3000:]
        assert_same_bits(reference, run)


@pytest.mark.parametrize("swapper", ["params", "optimizer"])
def test_a_swapper_one_rank_cannot_build_stops_every_rank(tmp_path, swapper):
    """Regression test (helper-195): a swapper refused on one rank alone (its swap folder held by another run, a
    stale build lock or a memlock limit on its node) stopped that rank with a clear error and left the other
    waiting for it in the next collective (NCCL: until its timeout; gloo: "Connection reset by peer" once it
    exited). Every rank stops now, the others saying why."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "one_rank_refused.py")
    result = launch_ranks(script, [swapper, tmp_path / "nvme"], 2, cleanup=[tmp_path / "nvme"], timeout=240,
                          forked=True)
    what = {"params": "parameter swapper", "optimizer": "optimizer swapper"}[swapper]
    assert result["error"] == f"TencacheError: another rank could not build its {what} (its error says why): " \
                              f"stopped on every rank rather than leave this one waiting for it", result


@pytest.mark.parametrize("which", ["initialize", "initialize-first"])
def test_a_configuration_one_rank_refuses_at_initialize_stops_every_rank(tmp_path, which):
    """Regression test (helper-213): deepspeed.initialize's check of the configuration refused on one rank alone (a
    path its node cannot write, a stale build lock there); that rank stopped and the others went on into the
    engine's collectives (NCCL: until its timeout; gloo: "Connection reset by peer"). Every rank stops now; also in
    a script whose first distributed call is initialize itself (helper-225: the ranks agreed through a
    deepspeed.comm not yet set up, that is not at all)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "one_rank_refused.py")
    result = launch_ranks(script, [which, tmp_path / "nvme"], 2, cleanup=[tmp_path / "nvme"], timeout=240,
                          forked=True)
    assert result["error"] == "TencacheError: deepspeed.initialize: another rank refused this configuration (its " \
                              "error says why); stopped on every rank rather than leave this one waiting for it", \
        result


def test_a_save_one_rank_cannot_clear_its_earlier_files_for_stops_every_rank(tmp_path):
    """Regression test (helper-202): a save into a tag saved before removes each rank's swap files of that save
    first; where that failed on one rank (files of another uid on root-squashed NFS), that rank raised before
    DeepSpeed's save and the other went on into the save's barrier (NCCL: until its timeout). Every rank stops."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "one_rank_refused.py")
    result = launch_ranks(script, ["save", tmp_path / "nvme"], 2, cleanup=[tmp_path / "nvme"], timeout=240,
                          forked=True)
    assert result["error"] == "TencacheError: save_checkpoint: another rank could not remove its swap files of an " \
                              "earlier save into this tag (its error says why); the save stops on every rank", result
