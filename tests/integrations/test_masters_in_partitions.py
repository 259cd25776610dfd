"""MastersInPartitions without stage 3 (an optimizer swapper made outside its initialisation): no partition holds a
master, so every call is the no-op or the False it is with nothing held, and nothing raises. The calls with stage 3
are exercised on the real engine (tests/deepspeed/test_master_copies.py, test_param_swapper_faults.py)."""
import torch

from tencache_ds.integrations.deepspeed.masters_in_partitions import MastersInPartitions


def test_without_stage3_no_master_is_in_partitions_and_nothing_is_owed():
    masters = MastersInPartitions(None, torch.float32, write=None, writes_behind=True)
    assert masters.copies is None and masters.writes is None
    view = torch.zeros(4)
    masters.before_lend("g", from_partitions=False)
    masters.lent("g")
    assert not masters.current("g") and not masters.owed("g")
    assert not masters.fill("g", view) and not view.any()
    assert not masters.released("g", changed=True)
    assert not masters.take_debt("g")
    assert not masters.give_back_owed("g", "/nonexistent", release_unwritten=lambda path: True)
    masters.owed_again_unlent("g", "/nonexistent")
    masters.check_none_lent_behind(["g"])
    masters.copied_to_partitions(0, "g", lent=True)
    masters.forget("g")
    masters.forget_all()
    masters.settle()
    masters.close()
    assert masters.stats() == {"optimizer_masters_written_behind": 0, "optimizer_master_bytes_written_behind": 0,
                               "optimizer_masters_owed": 0, "optimizer_master_bytes_read_from_partition_files": 0}
