"""offload_param.max_in_cpu at DeepSpeed's default (1e9): stage 3 reads every partition that fits into a CPU buffer
of its own, once, after zero.Init (`_move_to_flat_buffer` -> `swap_into_buffer`) and never swaps it again. tencache
keeps no copy and no slot for those partitions (before: a pinned cached copy of each, about 2 bytes per parameter
in bf16, plus their slots), and trains with stock's bits. Real engine, real files."""
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
