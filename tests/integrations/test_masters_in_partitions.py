"""MastersInPartitions without stage 3 (an optimizer swapper made outside its initialisation): no partition holds a
master, so every call is the no-op or the False it is with nothing held, and nothing raises. The calls with stage 3
are exercised on the real engine (tests/deepspeed/test_master_copies.py, test_param_swapper_faults.py); a failure
of stage 3's walk, which no engine makes on demand, is stood in for here."""
import pytest
import torch

from tencache_ds.integrations.deepspeed.master_write_behind import MasterWriteBehind
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
                               "optimizer_masters_filled_ahead": 0, "optimizer_masters_owed": 0,
                               "optimizer_master_bytes_read_from_partition_files": 0}


class _WalkFails:
    """Stage 3's walk of a sub-group's partitions raising (what MasterCopies asks it): the one part not run for
    real here, as no engine makes it fail on demand."""

    def current(self, group, anywhere=False):
        raise KeyError(f"no partitions recorded for {group}")


def test_a_debt_that_cannot_be_owed_again_leaves_the_master_file_behind_for_good_not_forgotten(tmp_path):
    """A master lent with its file's debt whose lend failed: where asking whether its partitions still hold it
    raises, the file is behind and nothing knows it was (before, the error was swallowed and the debt dropped: a
    later swap-in would read the stale file). Now every settle raises, naming the file."""
    masters = MastersInPartitions(None, torch.float32, write=None, writes_behind=True)
    masters.copies = _WalkFails()
    masters.writes = MasterWriteBehind(lambda group: None, lambda group: None, lambda group, into: None,
                                       lambda *args, **kwargs: None, torch.float32)
    masters._lent_with_debt.add("g")
    path = str(tmp_path / "g.master")
    masters.owed_again_unlent("g", path)  # never raises: the caller raises its own error
    with pytest.raises(RuntimeError, match="g.master"):
        masters.settle()
    with pytest.raises(RuntimeError):
        masters.close()
