"""The fp32 masters written from the parameter partitions where something needs their files (integrations/deepspeed/
master_write_behind.py): what is owed goes to the right offsets of the master's file at a settle and not before, a
settle waits only for the masters made of the partitions named, a failed write stops every later settle, a swap-in
that fills a master from its partitions takes its debt over, and a master owed again waits for its last write first.
Real files through the real I/O engine; partitions are plain tensors."""
import threading
from concurrent.futures import Future

import pytest
import torch

from tencache_ds.integrations.deepspeed.master_write_behind import MasterWriteBehind, settle_owed_masters
from tencache_ds.io.direct_io import DirectFileIO


class Partitions:
    """group -> (ds_ids, views), with groups that can be taken out of memory (``gone``)."""

    def __init__(self, groups):
        self.groups = groups
        self.gone = set()

    def __call__(self, group):
        if group in self.gone or group not in self.groups:
            return None
        ids, views = self.groups[group]
        return ids, views


class HeldWrites:
    """An engine whose writes complete only when released (``release``), to see what waits for them."""

    def __init__(self):
        self.issued = []
        self.gate = threading.Event()
        self.error = None

    def write(self, tensor, path, file_offset=0):
        future = Future()
        self.issued.append((path, file_offset, tensor.numel()))

        def finish():
            self.gate.wait()
            if self.error is not None:
                future.set_exception(self.error)
            else:
                future.set_result(tensor.numel() * tensor.element_size())
        threading.Thread(target=finish, daemon=True).start()
        return future


@pytest.fixture
def io():
    engine = DirectFileIO(num_threads=2)
    yield engine
    engine.close()


@pytest.fixture(autouse=True)
def writers(monkeypatch):
    """Every writer a test makes, closed after it whatever happened (the module settles every live one)."""
    made = []
    init = MasterWriteBehind.__init__

    def init_noted(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(MasterWriteBehind, "__init__", init_noted)
    yield made
    for writer in made:
        writer._failed = None
        writer._owed.clear()
        writer.close()


def test_an_owed_master_is_written_from_its_partitions_at_their_offsets_at_a_settle_and_not_before(tmp_path, io):
    path = str(tmp_path / "master.swp")
    open(path, "wb").write(bytes(4 * 10))  # the old master: zeros
    first, second = torch.arange(4, dtype=torch.float32), torch.arange(10, 16, dtype=torch.float32)
    writes = MasterWriteBehind(Partitions({"g": ([1, 2], [first, second])}), io.write)
    writes.owe("g", path)
    assert writes.owed_masters == 1
    assert torch.equal(torch.from_file(path, size=10, dtype=torch.float32), torch.zeros(10))  # nothing yet
    settle_owed_masters([3])  # no partition of its: still owed, nothing written
    assert writes.owed_masters == 1 and writes.masters_written_behind == 0
    writes.settle()
    assert torch.equal(torch.from_file(path, size=10, dtype=torch.float32), torch.cat([first, second]))
    assert (writes.masters_written_behind, writes.bytes_written_behind) == (1, 40)
    assert not writes.owes_any
    writes.close()


def test_a_settle_waits_for_the_masters_made_of_the_partitions_named_and_no_other():
    engine = HeldWrites()
    views = {"a": ([1, 2], [torch.ones(2), torch.ones(2)]), "b": ([3], [torch.ones(4)])}
    writes = MasterWriteBehind(Partitions(views), engine.write)
    writes.owe("a", "a.swp")
    writes.owe("b", "b.swp")
    settled = threading.Thread(target=settle_owed_masters, args=([3],))
    settled.start()
    settled.join(timeout=0.5)
    assert settled.is_alive()  # waiting for b's write
    assert [path for path, _offset, _numel in engine.issued] == ["b.swp"]  # a is still owed, not started
    engine.gate.set()
    settled.join(timeout=5)
    assert not settled.is_alive()
    assert writes.groups_of({1}) == ["a"] and writes.groups_of({3}) == []
    assert [(path, offset) for path, offset, _numel in engine.issued] == [("b.swp", 0)]
    settle_owed_masters()  # every group: a is started and waited for
    assert [(path, offset) for path, offset, _numel in engine.issued][1:] == [("a.swp", 0), ("a.swp", 8)]
    assert not writes.owes_any
    writes.close()


def test_a_failed_write_stops_every_later_settle():
    engine = HeldWrites()
    engine.error = OSError(5, "I/O error")
    engine.gate.set()
    writes = MasterWriteBehind(Partitions({"g": ([1], [torch.ones(4)])}), engine.write)
    writes.owe("g", "g.swp")
    with pytest.raises(OSError):
        writes.settle()
    with pytest.raises(OSError):  # the file is stale for good: nothing may read it
        writes.settle(["g"])
    with pytest.raises(OSError):  # and no master is owed again
        writes.owe("g", "g.swp")


def test_a_write_that_cannot_be_issued_leaves_the_file_stale_for_good():
    def refused(tensor, path, file_offset=0):
        raise OSError(28, "No space left on device")
    writes = MasterWriteBehind(Partitions({"g": ([1], [torch.ones(4)])}), refused)
    writes.owe("g", "g.swp")
    with pytest.raises(OSError):
        writes.settle()
    with pytest.raises(OSError):
        writes.settle()


def test_a_master_whose_partitions_are_not_all_in_memory_is_not_owed_and_one_owed_can_be_cancelled():
    partitions = Partitions({"g": ([1], [torch.ones(4)]), "h": ([2], [torch.ones(4)])})
    engine = HeldWrites()
    writes = MasterWriteBehind(partitions, engine.write)
    partitions.gone.add("g")
    assert not writes.owe("g", "g.swp") and not writes.owes_any
    assert writes.owe("h", "h.swp")
    writes.cancel("h")  # its store wrote it after all
    assert not writes.owes_any
    writes.settle()
    assert engine.issued == []


def test_partitions_that_left_memory_before_their_write_started_are_an_error_not_a_stale_file():
    partitions = Partitions({"g": ([1], [torch.ones(4)])})
    writes = MasterWriteBehind(partitions, HeldWrites().write)
    writes.owe("g", "g.swp")
    partitions.gone.add("g")
    with pytest.raises(RuntimeError, match="left host memory"):
        writes.settle()


def test_a_swap_in_filled_from_the_partitions_takes_the_debt_over_and_writes_nothing():
    engine = HeldWrites()
    writes = MasterWriteBehind(Partitions({"g": ([1], [torch.ones(4)]), "h": ([2], [torch.ones(4)])}), engine.write)
    writes.owe("g", "g.swp")
    assert writes.take_over("g") and not writes.owes_any  # the lent master owes the file now
    assert not writes.take_over("g") and not writes.take_over("h")  # nothing owed: nothing taken
    writes.settle()
    assert engine.issued == [] and writes.masters_written_behind == 0
    # a master whose partitions left memory with its file behind: every later settle and owe raises
    assert isinstance(writes.stale_for_good(RuntimeError("behind")), RuntimeError)
    with pytest.raises(RuntimeError, match="behind"):
        writes.settle()
    with pytest.raises(RuntimeError, match="behind"):
        writes.owe("h", "h.swp")


def test_a_master_owed_again_waits_for_its_last_write_first():
    engine = HeldWrites()
    writes = MasterWriteBehind(Partitions({"g": ([1], [torch.ones(4)])}), engine.write)
    writes.owe("g", "g.swp")
    started = threading.Thread(target=writes.settle)  # its write is issued, and held in flight
    started.start()
    started.join(timeout=0.5)
    assert started.is_alive() and len(engine.issued) == 1
    again = threading.Thread(target=writes.owe, args=("g", "g.swp"))
    again.start()
    again.join(timeout=0.5)
    assert again.is_alive()  # the next update's master is not given back over a write still in flight
    engine.gate.set()
    again.join(timeout=5)
    started.join(timeout=5)
    assert not again.is_alive() and writes.owes_any
    writes.settle()
    assert len(engine.issued) == 2
    writes.close()
