"""offload_param.max_in_cpu at DeepSpeed's default (1e9): stage 3 reads every partition that fits into a CPU buffer
of its own, once, after zero.Init (`_move_to_flat_buffer` -> `swap_into_buffer`) and never swaps it again. tencache
keeps no copy and no slot for those partitions (before: a pinned cached copy of each, about 2 bytes per parameter
in bf16, plus their slots), and trains with stock's bits. Real engine, real files."""
import os

import pytest

from test_parity import assert_identical  # tests/deepspeed is on sys.path (pytest rootdir-relative imports)

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]  # two short training runs, 30-60 s

AUTO = {}
FAST = dict(dtype="fp32", steps=2)  # fp32: see test_residency.py


def test_partitions_stage3_keeps_in_cpu_leave_no_copy_and_no_slot_behind(train):
    stock = train(block=None, max_in_cpu=1e9, **FAST)
    ours = train(block=AUTO, max_in_cpu=1e9, **FAST)
    assert_identical(stock, ours)
    stats = ours.last_stats
    partition_bytes = 4 * ours.result["num_params"]  # fp32
    assert stats["param_cached_bytes"] == 0 and stats["param_in_use_bytes"] == 0
    # what is left is the slots of the partitions stage 3 still swaps (gpt2-tiny: one of 10, 1.5 MiB)
    assert stats["param_reserved_bytes"] < partition_bytes // 10, stats["param_reserved_bytes"]


UPDATE_ORDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "update_order.py")


def test_with_part_of_the_model_kept_in_cpu_the_backward_reads_ahead_the_updates_first_sub_group(train):
    """max_in_cpu below the model's size (at DeepSpeed's default 1e9, any model above about 1e9 elements per rank):
    stage 3 registers the swap info of the sub-groups without a flat partition in memory as it builds them, the
    others after, so the registered order starts in the middle of the update's. The backward's reads ahead took the
    registered order for the update's: the first sub-group the update steps was not read ahead (its whole read
    waited for in the update), and another was, held until the update came to it."""
    options = dict(max_in_cpu=7e6, sub_group_size=2e6, optimizer_offload_device="nvme", **FAST)
    stock = train(block=None, **options)
    ours = train(block={"host_cache_bytes": 0}, script=UPDATE_ORDER, **options)
    assert_identical(stock, ours)  # the order reads ahead in moves bytes, never the update's math
    record = ours.result["update_order"]
    # the sub-groups the swapper swaps (stage 3 leaves out any it keeps in memory), in the update's order
    swapped = [key for key in record["update_order"] if key in record["registered_order"]]
    assert record["registered_order"] != swapped  # the case: stage 3 registered them out of the update's order
    assert sorted(record["registered_order"]) == sorted(swapped)
    assert record["backward_orders"] and all(order == swapped for order in record["backward_orders"])
