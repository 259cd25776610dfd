"""The invariant: with the same seed and DeepSpeed config, tencache gives bit-identical per-step losses and final
fp32 master weights to stock ZeRO-Infinity (params and optimizer on NVMe). Real engine, real files, no mocks.

Each case also checks that tencache's swappers really ran (a run that silently fell back to stock would pass
the comparison and prove nothing).
"""
import functools
import json
import os
import shutil
import struct

import pytest
import torch

from conftest import REPO, result_of, run_helper
from tencache_ds.probes.limits import UNLIMITED, lockable_bytes_now

pytestmark = pytest.mark.deepspeed

STREAMING = {"host_cache_bytes": 0, "device_cache_bytes": 0}
# "required": the slots are locked even on the CPU accelerator, where "best_effort" locks none (where this process
# may lock enough: a non-root machine's memlock limit would stop the run, as "required" promises)
CAN_LOCK = lockable_bytes_now() == UNLIMITED or lockable_bytes_now() >= 1 << 30
STREAMING_LOCKED = dict(STREAMING, pin_memory="required") if CAN_LOCK else dict(STREAMING)
BASE = dict(dtype="fp32", grad_accum=1, steps=3)  # shared by several tests, so their stock run is made once
# bf16 matmuls run about 10x slower than fp32 ones on a CPU without bf16 instructions (AVX2 only): bf16 cases train
# on 16-token sequences, which changes the compute, not what is swapped (partition and optimizer sizes).
BF16 = dict(dtype="bf16", seq_len=16)
AUTO = {}  # every key at its default: "auto" budgets


def assert_same_bits(reference, ours):
    """ours gives reference's per-step loss bits, evaluation loss bits and final fp32 weights (reference: any run,
    e.g. stock with offload device "cpu" where stock NVMe departs from it)."""
    assert ours.last_stats["tencache_enabled"] == 1, "tencache did not replace the swappers"
    assert ours.loss_bits == reference.loss_bits, compute_environments(reference, ours)
    assert ours.result["weights_sha256"] == reference.result["weights_sha256"]
    assert [step.get("eval_loss_bits") for step in ours.result["steps"]] == \
        [step.get("eval_loss_bits") for step in reference.result["steps"]]


def compute_environments(reference, ours):
    """Both runs' kernel ISA, threads and processor (train.py's compute_environment), for a failure message."""
    return f"reference ran on {reference.result.get('compute')}, ours on {ours.result.get('compute')}"


def assert_untouched(stock):
    """``stock`` ran in a process that never imported tencache_ds: DeepSpeed exactly as installed."""
    assert stock.result["tencache_imported"] is False
    assert all(step["stats"] is None for step in stock.result["steps"])


def assert_identical(stock, ours):
    assert ours.last_stats["tencache_enabled"] == 1, "tencache did not replace the swappers"
    assert ours.last_stats["param_swapper_class"] == "TencacheParamSwapper"
    assert ours.last_stats["optimizer_swapper_class"] == "TencacheOptimizerSwapper"
    assert_untouched(stock)
    assert ours.loss_bits == stock.loss_bits, compute_environments(stock, ours)
    assert ours.result["weights_sha256"] == stock.result["weights_sha256"]


# ``gather``: how the final fp32 weights are read. "public": through DeepSpeed's API (safe_get_full_fp32_param), as a
# user reads them, a parameter at a time; stock NVMe swaps the parameter's whole sub-group in for each (stock's fp32
# AUTO case here: 17 s a run that way, 7 s read a sub-group at a time, 2026-12-02). So streaming in fp32 and the
# masters held by the host tier in bf16 read them that way (with test_bit_identical_through_the_deepspeed_launcher,
# AUTO in fp32, which shares the first's stock run), the other two a sub-group at a time (the same bytes:
# conftest's "grouped").
@pytest.mark.parametrize("dtype, grad_accum, block, gather", [
    ("fp32", 1, STREAMING, "public"),
    ("bf16", 2, STREAMING_LOCKED, "grouped"),
    ("bf16", 1, AUTO, "public"),
    ("fp32", 2, AUTO, "grouped"),
])
def test_bit_identical_to_stock(train, dtype, grad_accum, block, gather):
    options = dict(BASE, **(BF16 if dtype == "bf16" else {}), grad_accum=grad_accum, weights_gather=gather)
    stock = train(block=None, **options)
    ours = train(block=block, **options)
    assert_identical(stock, ours)
    # gradient clipping is on in the config, and the runs really used NVMe
    assert stock.result["ds_config"]["gradient_clipping"] > 0
    # the global gradient norm, summed from each gradient's norm (tencache's: gradient_norms.py), is stock's bit for
    # bit at every step, and above the clipping threshold at some: the norms reach the weights, so a norm that
    # differed would show in them too
    norms = [step["grad_norm_bits"] for step in stock.result["steps"]]
    assert [step["grad_norm_bits"] for step in ours.result["steps"]] == norms
    assert any(struct.unpack(">d", bytes.fromhex(bits))[0] > stock.result["ds_config"]["gradient_clipping"]
               for bits in norms if bits is not None)
    assert ours.last_stats["nvme_write_bytes"] > 0
    stats = ours.last_stats
    # one rank: every gradient bucket's reduce-scatter gave views of the gradients, and each gradient was partitioned
    # at once, not copied into stage 3's contiguous bucket first (one_rank_reduce.py)
    assert stats["gradient_reductions_without_copy"] > 0
    assert stats["gradients_partitioned_at_once"] > 0
    # the clipped steps' norms were tencache's (gradient_norms.py): one float64 buffer, let go at each update
    assert stats["gradient_norms_in_reused_memory"] > 0 and stats["gradient_norm_scratch_peak_bytes"] > 0
    for key in ("pinned_bytes_reserved", "pinned_bytes_peak_in_use", "nvme_read_bytes", "nvme_write_bytes",
                "stock_pinned_bytes_estimate"):
        assert key in stats, key
    if block in (STREAMING, STREAMING_LOCKED):  # the foundation target: at most half of stock's pinned memory
        assert 0 < stats["param_reserved_bytes"] <= 0.5 * stats["stock_pinned_bytes_estimate"]
        if block.get("pin_memory") == "required":
            assert stats["pinned_bytes_reserved"] == stats["param_reserved_bytes"]
        else:  # nothing copies from the slots on the CPU accelerator: none is locked
            assert stats["pinned_bytes_reserved"] == stats["param_locked_bytes"] == 0
        assert stats["buffer_fallbacks"] == 0
        assert stats["nvme_read_bytes"] > 0


def test_bit_identical_through_the_deepspeed_launcher(train):
    # the reference as a plain process (shared with test_bit_identical_to_stock[fp32-1-...]), ours launched
    stock = train(block=None, **dict(BASE, weights_gather="public"))
    ours = train(block=AUTO, launcher="deepspeed", **dict(BASE, weights_gather="public"))
    assert_identical(stock, ours)
    assert "[tencache] pinned" in ours.output  # stats logged once at start-up
    assert ours.output.count("[tencache] pinned") == 1
    # safe_get_full_fp32_param reads the master alone: its sub-group is lent without the gradient (which was filled
    # from stage 3's buffer at every call, a pass over the sub-group's gradient for nothing), with stock's bits
    assert ours.result["stats_after_weights_gather"]["optimizer_fragment_swap_ins_without_gradient"] > 0


# bf16 for "convert": DeepSpeed's conversion of a model built outside zero.Init casts it to bf16 on the CPU
# accelerator even in an fp32 config, and stock then fails in its first matmul (Float and BFloat16).
@pytest.mark.parametrize("init, dtype", [("hf", "fp32"), ("convert", "bf16")])
def test_bit_identical_for_every_way_of_building_the_model(train, init, dtype):
    options = dict(BF16 if dtype == "bf16" else {"dtype": dtype}, init=init, steps=2)
    stock = train(block=None, **options)
    ours = train(block=STREAMING, **options)
    assert_identical(stock, ours)


@pytest.mark.parametrize("optimizer", ["Lion", "Adagrad"])
def test_bit_identical_with_deepspeeds_other_cpu_optimizers(train, tmp_path, optimizer):
    """DeepSpeed's other CPU optimizers keep other state than Adam's two moments (DeepSpeedCPULion: one,
    DeepSpeedCPUAdagrad: the squared sum), so their sub-groups swap other tensors. Six sub-groups under a 20 MB
    budget: some tensors held, prefixes of others, the rest streamed."""
    with open(os.path.join(REPO, "configs", "stock-nvme.json")) as f:
        config = json.load(f)
    config["optimizer"] = {"type": optimizer, "params": {"lr": 1e-3}}
    config["zero_optimization"]["offload_optimizer"]["buffer_count"] = 12  # 12 streaming slots (below)
    path = tmp_path / f"{optimizer}.json"
    path.write_text(json.dumps(config))
    options = dict(BASE, sub_group_size=2_000_000)
    stock = train(config=str(path), block=None, **options)
    ours = train(config=str(path), block={"host_cache_bytes": "20MB"}, **options)
    assert_identical(stock, ours)
    stats = ours.last_stats
    assert stats["optimizer_cache_cached_tensors"] > 0 and stats["optimizer_cache_prefix_tensors"] > 0
    assert stats["optimizer_cache_misses"] > 0
    # The least the tier can shrink to under memory pressure (plan/host_tier.streaming_tensors_at_once): Adam's 4
    # tensors a sub-group whatever the optimizer (planning Adagrad's as 3 made it 6 of 8 slots where a run held 7),
    # read ahead and written behind: 11 of the 12 slots (8 before writes behind were counted).
    slot = stats["optimizer_reserved_bytes"] // 12
    assert stats["optimizer_least_footprint_bytes"] == 11 * slot
    assert 0 < stats["optimizer_reserved_bytes"] - stats["optimizer_retired_bytes"]  # slots the run brought back


def test_bit_identical_with_bf16_masters_and_optimizer_state(train, tmp_path, request):
    """bf16 masters and Adam's moments in bf16 (``bf16_master_weights_and_grads`` + ``bf16_optimizer_states``): the
    optimizer's sub-groups are bf16 files. Stock NVMe stops on an assertion (its swap buffers are fp32: ``assert
    dtype == self.dtype``), so the reference is stock CPU offload. Six sub-groups under a 20 MB budget: some
    tensors held, prefixes of others, the rest streamed. (With the moments in fp32 beside bf16 masters the run is
    refused: tests/test_config_validation.py.) Its checkpoint goes to another file system where there is one
    (/dev/shm): the swap files cannot be linked there, and those the tier holds are written from its bf16 buffers
    (a save failed on them with "Got unsupported ScalarType BFloat16" until 2026-12-02)."""
    with open(os.path.join(REPO, "configs", "stock-nvme.json")) as f:
        config = json.load(f)
    config["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    path = tmp_path / "bf16-masters.json"
    path.write_text(json.dumps(config))
    # no dtype: train.py's would replace "bf16"
    options = dict(grad_accum=1, sub_group_size=2_000_000, seq_len=BF16["seq_len"])
    folders = {name: str(tmp_path / name) for name in ("stock", "ours")}
    across = os.path.isdir("/dev/shm") and os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev
    if across:
        folders["ours"] = os.path.join("/dev/shm", f"tencache-test-bf16-ckpt-{os.getpid()}")
        request.addfinalizer(functools.partial(shutil.rmtree, folders["ours"], ignore_errors=True))
    stock = train(config=str(path), block=None, offload_device="cpu", steps=3, save_after=1,
                  checkpoint_dir=folders["stock"], **options)
    block = {"host_cache_bytes": "20MB"}
    ours = train(config=str(path), block=block, steps=3, save_after=1, checkpoint_dir=folders["ours"], **options)
    assert_identical(stock, ours)
    if across:  # the files were written, not linked
        [saved] = [line for line in ours.output.splitlines() if "[tencache] save" in line and "swap files" in line]
        assert "(0 linked," in saved, saved
    stats = ours.last_stats
    assert stats["optimizer_cache_cached_tensors"] > 0 and stats["optimizer_cache_prefix_tensors"] > 0
    # its checkpoint: the bf16 masters in the ZeRO file (the save mapped them as fp32, stock's placeholder dtype, and
    # stopped: "size 5508096 is smaller than the required mapping size 11016192"), and a resume that goes on exactly
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    consolidated = {name: get_fp32_state_dict_from_zero_checkpoint(folder, tag="ckpt")
                    for name, folder in folders.items()}
    assert list(consolidated["ours"]) == list(consolidated["stock"])
    for key, tensor in consolidated["stock"].items():
        assert tensor.dtype == consolidated["ours"][key].dtype and torch.equal(tensor, consolidated["ours"][key]), key
    resumed = train(config=str(path), block=block, steps=2, resume=True, checkpoint_dir=folders["ours"], **options)
    assert resumed.loss_bits == stock.loss_bits[1:]
    assert resumed.result["weights_sha256"] == stock.result["weights_sha256"]


def test_stock_crash_config_trains_under_tencache(train):
    """Regression test: `Not enough buffers 0 for swapping 1` (buffer_count 3 with a large
    stage3_max_reuse_distance, DeepSpeed #3062). Stock dies at step 1; tencache trains, and its losses equal
    stock's on the same model with enough buffers (buffer_count and reuse distance change retention, not math)."""
    crashed = train(config="stock-crash.json", block=None, expect_failure=True, **BASE)
    assert "Not enough buffers" in crashed.output
    ours = train(config="stock-crash.json", block=STREAMING, **BASE)
    reference = train(config="stock-nvme.json", block=None, **BASE)
    assert ours.loss_bits == reference.loss_bits
    assert ours.result["weights_sha256"] == reference.result["weights_sha256"]


def test_disabled_or_absent_block_is_stock(train):
    """Installed but not asked for, tencache hands DeepSpeed its own swappers: the bits of a process that never
    imported it, with or without a block that says "enabled": false."""
    stock = train(block=None, **BASE)
    for run in (train(block={"enabled": False}, **BASE), train(block=None, plugin_imported=True, **BASE)):
        assert run.result["tencache_imported"] is True
        assert run.last_stats["tencache_enabled"] == 0
        assert run.last_stats["param_swapper_class"] == "AsyncPartitionedParameterSwapper"
        assert "[tencache]" not in run.output
        assert run.loss_bits == stock.loss_bits
        assert run.result["weights_sha256"] == stock.result["weights_sha256"]
    assert_untouched(stock)


def test_profile_is_recorded_then_reused_and_stays_bit_identical(train, tmp_path):
    """A host cache smaller than the model forces evictions, so the profiled (Belady) choices matter: gpt2-tiny's
    one optimizer sub-group has four 60 MB tensors (master, two moments, gradient), and 150 MB holds two."""
    block = {"host_cache_bytes": 150_000_000, "profile_path": str(tmp_path / "profile.json")}
    stock = train(block=None, **BASE)
    first = train(block=block, **BASE)
    second = train(block=block, **BASE)
    assert (first.last_stats["param_profile"], second.last_stats["param_profile"]) == ("recorded", "loaded")
    assert second.last_stats["optimizer_profile"] == "loaded"
    # the optimizer files did not all fit: the profiled policy chose which to keep (the moments, whose reads it
    # saves; the master, which the held parameter partitions fill, is not read: plan/eviction.CopiesElsewhere)
    stats = second.last_stats
    assert stats["optimizer_cache_hits"] > 0 and stats["optimizer_cache_misses"] == 0
    assert stats["optimizer_masters_from_partitions"] > 0
    assert_identical(stock, first)
    assert_identical(stock, second)
    # the steps that repeated the profile were timed and saved beside it (profile/steady.py) while training kept
    # stock's bits
    from tencache_ds.profile.store import read_sections
    assert any(section.steady is not None for section in read_sections(block["profile_path"]).values())
    # the same profile for another model is stale: reported, replaced, never used
    other = train(block=block, model="opt-tiny", steps=2, dtype="fp32", seq_len=16)
    assert "is stale" in other.output and other.last_stats["param_profile"] == "recorded"
    # and for the same model at another micro-batch, whose compute between accesses the reads ahead are planned
    # from (helper-234: its timings were reused for good, the order being the same)
    second_batch = train(block=block, **dict(BASE, steps=2, micro_batch=4))
    again = train(block=block, **dict(BASE, steps=2, micro_batch=2))
    assert "[params] is stale" in again.output and again.last_stats["param_profile"] == "recorded"
    assert second_batch.last_stats["param_profile"] == "recorded"


def test_unknown_key_stops_with_an_error_naming_it(train):
    failed = train(block={"host_cache": 0}, expect_failure=True, steps=1)
    assert "tencache.host_cache: unknown key" in failed.output


def test_unusable_nvme_path_stops_with_an_error_naming_the_key(train, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    failed = train(block=STREAMING, nvme_path=str(blocker / "nvme"), expect_failure=True, steps=1)
    assert "zero_optimization.offload_param.nvme_path" in failed.output
    assert "TencacheResourceError" in failed.output


def run_two_engines(tmp_path, mode, which):
    proc = run_helper(os.path.join(os.path.dirname(__file__), "two_engines.py"),
                      [tmp_path / f"nvme-{mode}-{which}", mode, which])
    return proc, result_of(proc.stdout)


def test_two_engines_sharing_an_nvme_path_keep_their_files(tmp_path):
    """Stock: the second zero.Init deletes the first model's swap files, so the first engine cannot train.
    tencache: one swapper per (nvme_path, dtype, rank); both train, and the first engine's losses are the
    bits it gets when it trains alone under stock."""
    stock_proc, _ = run_two_engines(tmp_path, "stock", "both")
    # the first engine's read of a file the second zero.Init deleted (not any failure: helper-227)
    assert stock_proc.returncode != 0 and "swap_handle.async_pread(buffer, path, 0) == 0" in stock_proc.stderr, \
        stock_proc.stderr[-3000:]
    alone_proc, alone = run_two_engines(tmp_path, "stock", "first-only")
    assert alone_proc.returncode == 0, alone_proc.stderr[-3000:]
    ours_proc, ours = run_two_engines(tmp_path, "tencache", "both")
    assert ours_proc.returncode == 0, ours_proc.stderr[-3000:]
    assert ours["tencache_ran"] == {"first": 1, "second": 1}
    assert ours["first"] == alone["first"]
    assert len(ours["second"]) == 3


def test_two_engines_trained_at_once_each_reuse_their_own_optimizer_profile_and_meter_to_their_own_file(tmp_path):
    """An actor and a critic, one profile file: each optimizer swapper records its own section ("optimizer",
    "optimizer-2"), and each parameter swapper ("params", "params-2"), so that a second run loads both. Until
    2026-12-07 both wrote "optimizer": each run found the other engine's profile there, stale, and profiled again
    (helper-162). One metrics_path: the second engine's records go to metrics.engine2.jsonl; in one file both were
    numbered from 0, nothing telling them apart (helper-173)."""
    runs = [run_two_engines(tmp_path, "tencache-profiled", "both") for _ in range(2)]
    for proc, _ in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    (_, first), (_, second) = runs
    assert first["optimizer_profiles"] == {"first": "recorded", "second": "recorded"}
    assert second["optimizer_profiles"] == {"first": "loaded", "second": "loaded"}
    # the second model's parameters in a folder of their own: a parameter swapper each, "params" and "params-2"
    # (helper-169: both wrote "params")
    assert first["param_profiles"] == {"first": "recorded", "second": "recorded"}
    assert second["param_profiles"] == {"first": "loaded", "second": "loaded"}
    assert second["first"] == first["first"] and second["second"] == first["second"]  # a profile moves no bits
    from tencache_ds.profile.store import read_sections
    assert {"optimizer", "optimizer-2", "params", "params-2"} <= set(read_sections(str(tmp_path / "profile.json")))
    for name in ("metrics.jsonl", "metrics.engine2.jsonl"):  # two runs of three steps each, appended
        with open(tmp_path / name) as handle:
            assert [json.loads(line)["step"] for line in handle] == [0, 1, 2, 0, 1, 2], name


def test_two_engines_trained_at_once_share_one_host_tier(tmp_path):
    """``host_cache_bytes`` is the rank's: the first engine's optimizer takes what its state needs of it, the second
    what is left, and both train with the bits of one trained alone (stock). Until 2026-12-07 each optimizer took the
    whole tier after the parameter cache, twice the budget in all (helper-162)."""
    proc, ours = run_two_engines(tmp_path, "tencache-budget", "both")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (first_budget, first_state), (second_budget, second_state) = ours["budgets"]["first"], ours["budgets"]["second"]
    tier = 40 * 2**20
    assert first_state < tier - ours["param_cache"] < first_state + second_state  # the tier cannot hold both
    assert min(first_budget, first_state) + second_budget + ours["param_cache"] <= tier
    assert second_budget > 0 and min(first_budget, first_state) == first_state  # the first keeps all it needs
    alone_proc, alone = run_two_engines(tmp_path, "stock", "first-only")
    assert alone_proc.returncode == 0, alone_proc.stderr[-3000:]
    assert ours["first"] == alone["first"]


def test_destroying_one_of_two_engines_over_models_of_one_zero_init_leaves_the_other_training(tmp_path):
    """Two models built in one zero.Init context share its parameter swapper; each gets an engine, and the first
    is destroyed after a step. The swapper counted the contexts that built it, not the engines: the first destroy
    closed it, and the second engine's next swap-in failed. Now the second trains on with stock NVMe's bits."""
    stock_proc, stock = run_two_engines(tmp_path, "stock", "one-init")
    assert stock_proc.returncode == 0, stock_proc.stderr[-3000:]
    ours_proc, ours = run_two_engines(tmp_path, "tencache", "one-init")
    assert ours_proc.returncode == 0, ours_proc.stderr[-3000:]
    assert ours.pop("tencache_ran") == {"first": 1, "second": 1}  # equal to stock, but not stock (helper-227)
    assert ours == stock and len(ours["second"]) == 3 and len(ours["first"]) == 1  # losses and trained weights
    assert len(ours["second_weights_sha256"]) == 64


def test_a_second_model_with_another_tencache_block_in_the_same_nvme_path_is_refused(tmp_path):
    """The two models share one parameter swapper (one per nvme_path, dtype and rank), so the second cannot have
    its own budget: an error names the keys instead of silently running with the first model's settings."""
    proc, _ = run_two_engines(tmp_path, "tencache-mismatch", "both")
    assert proc.returncode != 0
    assert "tencache.host_cache_bytes" in proc.stderr and "nvme_path" in proc.stderr, proc.stderr[-3000:]


def test_bit_identical_with_offload_optimizer_fast_init(train, tmp_path):
    """fast_init builds the fp32 master files straight from the fp16 partition files
    (initialize_from_swapped_fp16_params, reading get_path(param, must_exist=True))."""
    import json
    import os
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "stock-nvme.json")) as handle:
        config = json.load(handle)
    config["zero_optimization"]["offload_optimizer"]["fast_init"] = True
    path = tmp_path / "fast-init.json"
    path.write_text(json.dumps(config))
    stock = train(config=str(path), block=None, dtype="fp32", steps=2)
    ours = train(config=str(path), block=STREAMING, dtype="fp32", steps=2)
    assert_identical(stock, ours)
