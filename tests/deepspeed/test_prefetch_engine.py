"""The profile-driven prefetch on the real engine: with every partition read from NVMe (no host cache, no device
tier) the schedule reads partitions ahead of their use, and stays bit-identical through an evaluation pass between
steps and activation checkpointing switched on mid-run (the sequence diverges from the profile: demand fetching
for that pass, then a new profile); the next step's first reads during the update; and, under a host cache
smaller than the partitions, reads ahead that take the buffers of partitions held for later."""
import pytest

from test_device_tier_engine import SEQUENCE_CHANGES  # tests/deepspeed is on sys.path (rootdir-relative imports)
from test_parity import assert_identical, assert_same_bits
from test_residency import SUB_GROUPS

pytestmark = pytest.mark.deepspeed

STREAMING = {"host_cache_bytes": 0, "device_cache_bytes": 0}


def test_scheduled_reads_ahead_through_eval_and_a_changed_sequence(train):
    """Reference: stock with offload device "cpu" (stock NVMe departs from it once checkpointing is switched on,
    docs/reliability.md)."""
    reference = train(block=None, offload_device="cpu", **SEQUENCE_CHANGES)
    ours = train(block=STREAMING, **SEQUENCE_CHANGES)
    assert_same_bits(reference, ours)
    steps = ours.result["steps"]
    assert steps[2]["stats"]["param_scheduled_reads"] > 0  # the schedule read ahead before the change
    assert ours.last_stats["param_profile_divergences"] > 0  # and the change was seen as a divergence
    assert ours.last_stats["device_tier_admitted"] == 0  # device_cache_bytes 0: the tier kept nothing


def test_the_next_steps_first_reads_start_during_the_optimizer_step(train):
    """Issue 15, item 4: the step's first partitions, which no access of the step comes early enough to read ahead,
    are read during the optimizer step before it, each once its new bytes are written (8 optimizer sub-groups: the
    first ones' partitions are on file while the later ones update). The same bits as stock; a read before the write
    would have given the step the old weights."""
    stock = train(block=None, **SUB_GROUPS)
    ours = train(block=STREAMING, **SUB_GROUPS)
    assert_identical(stock, ours)
    steps = ours.result["steps"]
    assert steps[-1]["stats"]["param_update_reads"] > steps[2]["stats"]["param_update_reads"] > 0


@pytest.mark.slow
def test_at_two_ranks_the_next_steps_first_reads_during_the_update_give_stock_cpu_offloads_bits(train):
    """The reads started during the update at 2 ranks, where each rank updates its own partitions and the
    coordinator's prefetch depth (available_swap_in_buffers) leaves our reads ahead out, so that the ranks answer
    alike and gather the same buckets: rank 0 (whose stats the run reports) starts them, and the run gives stock
    CPU offload's bits (stock NVMe crashes at 2 ranks with parameters on NVMe)."""
    two_ranks = dict(SUB_GROUPS, launcher="ranks", num_ranks=2, steps=4)
    reference = train(block=None, offload_device="cpu", **two_ranks)
    ours = train(block=STREAMING, **two_ranks)
    assert_same_bits(reference, ours)
    assert ours.last_stats["param_update_reads"] > 0


def test_reads_ahead_take_the_buffers_of_partitions_held_for_later_under_a_small_host_cache(train):
    """A host cache a fifth of the partitions a step reads (gpt2-small, 12 partitions of a size to the 5 slots of its
    class): every slot holds a cached partition, and a read ahead that took only free buffers seldom started
    (gpt2-2.7b beyond RAM: never; each read waited at its use behind the write of what it evicted). A read ahead now
    takes the buffer of the partition held for the farthest use after its target's (written first where the update
    changed it), and the run gives stock's bits."""
    shape = dict(model="gpt2-small", dtype="fp32", steps=5, seq_len=32, micro_batch=1)
    stock = train(block=None, **shape)
    ours = train(block={"host_cache_bytes": 100_000_000, "device_cache_bytes": 0}, **shape)
    assert_identical(stock, ours)
    assert ours.last_stats["param_prefetch_evictions"] > 0


def test_persistent_parameters_on_nvme_leave_the_profile_to_the_training_step(train):
    """A persistence threshold above the swap threshold puts persistent parameters on NVMe (gpt2-tiny fp32, 1e6
    elements). Stage 3 gathers them again at each step's end; that gather made a profile step of its own, which
    became the profile: every training step then left it twice, at its first access and at the gather, and nothing
    was read ahead (helper-169, helper-180): 11 divergences in 6 steps. Now the gather starts the next step's
    sequence. What is left follows the machine's load (the order a step records depends on which reads ahead were in
    time, helper-180, left alone): 2 divergences alone, 5 in the loaded suite, whose run then scheduled no read
    ahead; so the count, not the reads, is what tells the change apart here."""
    shape = dict(dtype="fp32", steps=6, persistence_threshold=1e6)
    stock = train(block=None, **shape)
    ours = train(block=STREAMING, **shape)
    assert_identical(stock, ours)
    assert ours.last_stats["param_profile_divergences"] <= 7  # without the change: two in every step after the first


@pytest.mark.parametrize("block", [{}, STREAMING], ids=["auto", "streaming"])
def test_persistent_parameters_on_nvme_at_two_ranks_keep_their_partition_until_their_gather_is_done(train, block):
    """Regression test (helper-195): at 2 ranks stage 3 releases a persistent parameter's partition right after
    starting its gather, which on a host accelerator reads the partition itself, on gloo's thread: released, the
    gather read the placeholder and the first forward stopped ("out->size == in->size * context->size"), or (a
    coalesced gather) the parameter came back in the placeholder's fp16 ("Float and Half"). Stock NVMe crashes at 2
    ranks with parameters on NVMe: the reference is stock CPU offload."""
    shape = dict(dtype="fp32", steps=3, seq_len=16, persistence_threshold=1e6, launcher="ranks", num_ranks=2)
    reference = train(block=None, offload_device="cpu", **shape)
    ours = train(block=block, **shape)
    assert_same_bits(reference, ours)
