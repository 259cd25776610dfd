"""The device tier (gathered parameters kept between uses, across the optimizer step) on the real engine: stock's
bits with it on — under a budget that forces it to choose, through an evaluation pass between training steps, and
with activation checkpointing switched on mid-run (the traced sequence changes: the tier falls back to demand
fetching and re-learns) — and the per-step metrics that show it working."""
import json

import pytest

# tests/deepspeed is on sys.path (pytest rootdir-relative imports)
from test_parity import assert_identical, assert_same_bits
from test_residency import FAST  # fp32 (why: there)

pytestmark = pytest.mark.deepspeed

# gpt2-tiny: ~60 MB of fp32 partitions in 10 swapped tensors; a third of that makes the tier choose.
TIGHT = {"device_cache_bytes": 20_000_000}
# shared with test_prefetch_engine.py, so the stock CPU offload reference is trained once
SEQUENCE_CHANGES = dict(steps=6, eval_every=2, checkpointing_from_step=3, **FAST)


def test_device_tier_keeps_everything_gives_stocks_bits_and_reports_each_step(train, tmp_path):
    block = {"metrics_path": str(tmp_path / "metrics.jsonl")}
    stock = train(block=None, steps=4, **FAST)
    ours = train(block=block, steps=4, **FAST)
    assert_identical(stock, ours)
    stats = ours.last_stats
    assert stats["device_cache_budget_bytes"] > 0 and stats["device_cache_bytes_in_use"] > 0
    # steady state: every parameter a module asks for is already gathered, no parameter or optimizer I/O waited;
    # at one rank on the CPU accelerator a gather is the partition itself, so the tier saves no bytes and its
    # metrics say "not applicable" rather than 100%
    assert stats["device_tier_applicable"] == 0
    assert stats["device_hit_rate"] is None and stats["device_fetch_bytes"] is None
    assert stats["device_fetch_s"] > 0  # the time in DeepSpeed's fetch path is real all the same
    second_step, last_step = ours.result["steps"][1]["stats"], stats  # the tier starts once a trace is complete
    assert last_step["device_hits"] - second_step["device_hits"] == \
        last_step["device_param_fetches"] - second_step["device_param_fetches"] > 0  # every use a hit
    assert stats["fetch_wait_s"] == 0.0 == stats["param_nvme_wait_s"] + stats["optimizer_nvme_wait_s"]
    # one metrics line per optimizer step, in the schema; stats(engine) carries the last line's numbers
    with open(block["metrics_path"]) as handle:
        lines = [json.loads(line) for line in handle]
    assert [line["step"] for line in lines] == [0, 1, 2, 3]
    assert {line["schema"] for line in lines} == {"tencache.metrics/9"}
    assert stats["device_fetch_s"] == lines[-1]["device_fetch_s"]
    assert stats["step_nvme_read_bytes"] == lines[-1]["nvme_read_bytes"] == 0
    assert lines[-1]["device_cache_peak_bytes"] >= lines[-1]["device_cache_bytes_in_use"] > 0


def test_tight_device_budget_chooses_and_gives_stocks_bits(train):
    stock = train(block=None, steps=4, **FAST)
    ours = train(block=TIGHT, steps=4, **FAST)
    assert_identical(stock, ours)
    stats = ours.last_stats
    assert 0 < stats["device_cache_bytes_in_use"] <= stats["device_cache_budget_bytes"]
    assert stats["device_tier_evicted"] > 0  # Belady made room: the tier really chose
    assert 0 < stats["device_hits"] < stats["device_param_fetches"]


def test_eval_pass_and_checkpointing_switched_on_mid_run_give_stocks_bits(train):
    """The reference is stock with offload device "cpu": stock NVMe itself departs from it here (step 4's loss
    7.1925 instead of 7.1915 in bf16, docs/reliability.md), while tencache gives stock CPU offload's bits."""
    reference = train(block=None, offload_device="cpu", **SEQUENCE_CHANGES)
    ours = train(block={}, **SEQUENCE_CHANGES)
    assert_same_bits(reference, ours)
    before_change = [ours.result["steps"][step]["stats"] for step in (1, 2)]
    # the tier was on before the change: every use of step 2 found its parameter gathered
    assert before_change[1]["device_hits"] - before_change[0]["device_hits"] == \
        before_change[1]["device_param_fetches"] - before_change[0]["device_param_fetches"]


def test_kept_parameters_updated_in_place_reach_the_file(train, tmp_path):
    """No host cache, device tier on: the kept partitions are updated in place by every optimizer step (stage 3
    never hands them to the swapper); a checkpoint mid-run releases them, and the next forward reads them back
    from their files, which must hold the new weights."""
    options = dict(steps=4, save_after=2, **FAST)
    stock = train(block=None, checkpoint_dir=str(tmp_path / "stock"), **options)
    ours = train(block={"host_cache_bytes": 0}, checkpoint_dir=str(tmp_path / "ours"), **options)
    assert_identical(stock, ours)
    assert ours.result["steps"][1]["stats"]["device_cache_bytes_in_use"] > 0  # kept when the save came


# Fine-tuning a frozen base model: only layer norms, biases and the position embedding train (BitFit-like); every
# other parameter is partitioned and swapped, gathered in forward and backward, and never updated.
FROZEN_BASE = dict(train_only="ln_|bias|wpe", **FAST)


def test_a_frozen_base_model_gives_stocks_bits(train):
    """Frozen parameters have no fp32 master: train.py reads their weights through GatheredParameters."""
    stock = train(block=None, steps=3, **FROZEN_BASE)
    ours = train(block={}, steps=3, **FROZEN_BASE)
    assert_identical(stock, ours)
    assert ours.last_stats["device_cache_bytes_in_use"] > 0


def test_a_frozen_base_model_through_eval_passes_at_two_ranks_gives_stock_cpu_offloads_bits(train):
    """At two ranks a kept parameter gives its host partition back (a gathered copy of its own holds the bytes),
    and an evaluation pass that follows the traced step keeps parameters so until the next optimizer step. The
    frozen weights read through GatheredParameters after the last evaluation then met DeepSpeed's assertion that a
    partition away on NVMe belongs to a parameter that is not gathered, on both ranks
    (coordinator.restoring_kept_partitions). Stock NVMe crashes at 2 ranks with parameters on NVMe: the reference is
    stock CPU offload."""
    options = dict(FROZEN_BASE, launcher="deepspeed", num_ranks=2, steps=4, grad_accum=2, eval_every=2,
                   seq_len=32, micro_batch=1, timeout=600)
    # the reference's ranks forked as the launcher starts them (tests/deepspeed/forkserver.py), tencache's launched
    reference = train(block=None, offload_device="cpu", **dict(options, launcher="ranks"))
    ours = train(block={}, **options)
    assert_same_bits(reference, ours)
    assert [step.get("eval_loss_bits") is not None for step in ours.result["steps"]] == [False, True, False, True]
    stats = ours.last_stats  # the tier held gathered parameters of its own (with their partitions given back)
    assert stats["device_tier_applicable"] == 1 and stats["device_cache_peak_bytes"] > 0
