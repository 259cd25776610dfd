"""The optimizer state read before the update asks (cache/optimizer_reads_ahead.py), over a real
OptimizerStore and real files: what is read in backward (the first sub-group's state, then the later ones' into idle
streaming slots, in the step's last backward only), what a swap-in takes, and that every read started is given back,
a failed one raised after the rest. The sub-groups are the swapper's swap infos as far as ReadsAhead reads them."""
import concurrent.futures
import dataclasses
import os
import threading
from typing import List

import pytest
import torch

from tencache_ds.cache.entry import EntryState
from tencache_ds.cache.optimizer_store import OptimizerStore
from tencache_ds.errors import StaleFileError
from tencache_ds.cache.optimizer_reads_ahead import ReadsAhead
from tencache_ds.io.direct_io import DirectFileIO

NUMEL = 100_000


@pytest.fixture(autouse=True)
def debug_checks(monkeypatch):
    monkeypatch.setenv("TENCACHE_DEBUG_CHECKS", "1")


@dataclasses.dataclass
class Tensor:
    swap_path: str


@dataclasses.dataclass
class SubGroup:
    param_id: str
    tensors: List[Tensor]
    gradient: bool = False  # False: the update reads it from stage 3's buffer (stage3_gradients.py)

    def has_gradients(self) -> bool:
        return self.gradient


def sub_groups_on_file(store, tmp_path, count):
    """``count`` sub-groups of a master and two moments each, written to their files (nothing kept: budget 0)."""
    groups = []
    for g in range(count):
        tensors = [Tensor(str(tmp_path / f"{prefix}{g}.swp")) for prefix in ("", "exp_avg-", "exp_avg_sq-")]
        for index, tensor in enumerate(tensors):
            store.lend_new(tensor.swap_path, NUMEL, tensor.swap_path).fill_(10 * g + index)
            store.release(tensor.swap_path, changed=True)
            store.wait_writes()
        groups.append(SubGroup(str(g), tensors))
    return groups


def warm_slots(store, tmp_path, count=8):
    """Every streaming slot in memory once (reads ahead never take a retired one)."""
    for slot in range(count):
        store.lend_new(f"warm{slot}", NUMEL, str(tmp_path / f"warm{slot}.swp"))
    for slot in range(count):
        store.release(f"warm{slot}", changed=True)
    store.wait_writes()


def make(io, streaming_slots=8):
    return OptimizerStore(torch.float32, lambda n: -(-n // 256) * 256, io, largest_numel=NUMEL,
                          streaming_slots=streaming_slots, host_tier_share=lambda: 0)


def all_paths(group):
    return [tensor.swap_path for tensor in group.tensors]


def test_backward_reads_the_first_sub_group_then_later_ones_into_idle_slots_in_the_last_backward(io, tmp_path):
    store = make(io)
    groups = sub_groups_on_file(store, tmp_path, 4)
    warm_slots(store, tmp_path)
    ahead = ReadsAhead(store, all_paths, lambda group: None)
    ahead.during_backward(groups, lent={}, last_backward=False)  # gradient accumulation: not the last backward
    assert ahead.in_backward == 0
    assert [store.state(path) for path in all_paths(groups[1])] == [EntryState.ON_FILE] * 3
    ahead.during_backward(groups, lent={"2": ["lent"]}, last_backward=True)
    # 8 slots: the first sub-group's 3, one left for the update's gradient; 4 more, skipping the lent sub-group 2
    assert ahead.in_backward == 4
    taken = {group.param_id: list(ahead.take(group.param_id)) for group in groups}
    assert taken == {"0": all_paths(groups[0]), "1": all_paths(groups[1]), "2": [], "3": all_paths(groups[3])[:1]}
    assert list(ahead.take("0")) == []  # taken once
    for group, paths in taken.items():
        for index, path in enumerate(paths):
            assert torch.all(store.wait_read(path) == 10 * int(group) + index)  # the file's bytes
            store.release(path)
    store.close()


def test_the_next_sub_group_is_read_into_spare_slots_before_the_update_waits_never_waiting(io, tmp_path):
    """``next_sub_group_if_free``, called before the update waits for the current sub-group's reads: it starts the
    next sub-group's reads only into slots free now, at most ``spare`` of them, never waiting for a write; what it
    leaves, ``next_sub_group`` starts after the waits, and what it started is not read twice."""
    store = make(io)
    groups = sub_groups_on_file(store, tmp_path, 3)
    warm_slots(store, tmp_path)
    held = [f"busy{slot}" for slot in range(7)]  # the update's other tensors: one idle slot left
    for key in held:
        store.lend_new(key, NUMEL, str(tmp_path / f"{key}.swp"))
    ahead = ReadsAhead(store, all_paths, lambda group: None)
    ahead.next_sub_group_if_free(groups[1], spare=0)  # nothing spare: nothing started
    assert ahead.before_own_waits == 0
    ahead.next_sub_group_if_free(groups[1], spare=2)  # two spare, one slot idle: one read, no wait
    assert ahead.before_own_waits == 1
    assert [store.state(path) for path in all_paths(groups[1])] == \
        [EntryState.READING, EntryState.ON_FILE, EntryState.ON_FILE]
    for key in held:
        store.release(key)  # unchanged: their slots are free at once
    ahead.next_sub_group(groups[1])  # after the waits: the rest
    paths = list(ahead.take("1"))
    assert paths == all_paths(groups[1])
    for index, path in enumerate(paths):
        assert torch.all(store.wait_read(path) == 10 + index)
        store.release(path)
    store.close()


def test_the_next_sub_group_is_not_read_early_into_room_the_budget_has(io, tmp_path):
    """Where the budget has room for the next sub-group's tensors, that room is the current swap-in's to take first
    (a lend without it would evict, maybe waiting for a write): the early read leaves them to ``next_sub_group``,
    which reads them into that room after the waits, kept."""
    store = OptimizerStore(torch.float32, lambda n: -(-n // 256) * 256, io, largest_numel=NUMEL, streaming_slots=8,
                           host_tier_share=lambda: 100 * NUMEL * 4)
    groups = sub_groups_on_file(store, tmp_path, 2)
    store.trim_kept(0)  # nothing kept: each tensor on file, the budget's room free
    warm_slots(store, tmp_path)
    ahead = ReadsAhead(store, all_paths, lambda group: None)
    ahead.next_sub_group_if_free(groups[1], spare=8)
    assert ahead.before_own_waits == 0
    assert [store.state(path) for path in all_paths(groups[1])] == [EntryState.ON_FILE] * 3
    store.close()


def test_every_read_started_is_given_back_and_a_failed_one_raised_after_the_rest(io, tmp_path):
    store = make(io)
    groups = sub_groups_on_file(store, tmp_path, 2)
    os.unlink(groups[0].tensors[1].swap_path)  # a file gone (a checkpoint load that stopped, say)
    ahead = ReadsAhead(store, all_paths, lambda group: None)
    for group in groups:
        ahead.next_sub_group(group)
    with pytest.raises(StaleFileError, match="exp_avg-0.swp is missing"):
        ahead.release_all()
    store.check_invariants()
    assert [store.state(path) for group in groups for path in all_paths(group)] == [EntryState.ON_FILE] * 6
    assert list(ahead.take("1")) == []
    store.close()


def test_an_interrupt_while_giving_back_reads_ahead_gives_back_the_rest_then_is_raised(io, tmp_path, monkeypatch):
    """Regression test (helper-203's review): the store raises a Ctrl-C that lands in a release's wait once that
    entry went back; release_all stopped there, and the reads not yet given back stayed READING, known to nobody
    (every later swap-in of their sub-groups: "already lent or being read"). A failure is raised after it."""
    store = make(io)
    groups = sub_groups_on_file(store, tmp_path, 2)
    os.unlink(groups[1].tensors[2].swap_path)  # one read fails as well
    ahead = ReadsAhead(store, all_paths, lambda group: None)
    for group in groups:
        ahead.next_sub_group(group)
    release, calls = store.release, []

    def interrupted_once(path, *args, **kwargs):
        calls.append(path)
        release(path, *args, **kwargs)  # the entry went back, then the postponed interrupt is raised
        if len(calls) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(store, "release", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        ahead.release_all()
    assert len(calls) == 6
    store.check_invariants()
    assert [store.state(path) for group in groups for path in all_paths(group)] == [EntryState.ON_FILE] * 6
    store.close()


def test_a_lent_first_sub_group_is_not_read_and_a_second_gradient_on_file_keeps_its_slot(io, tmp_path):
    """The first sub-group already swapped in (lent) is not read again; where the second sub-group's gradient is on
    file (not in stage 3's buffer), its read while the first steps needs a slot: one fewer for later sub-groups."""
    store = make(io)
    groups = sub_groups_on_file(store, tmp_path, 4)
    gradient = str(tmp_path / "1_gradient.swp")
    store.lend_new(gradient, NUMEL, gradient).fill_(-1)
    store.release(gradient, changed=True)
    store.wait_writes()
    groups[1].gradient = True
    warm_slots(store, tmp_path)
    ahead = ReadsAhead(store, all_paths, lambda group: gradient if group.param_id == "1" else None)
    ahead.during_backward(groups, lent={"0": ["lent"]}, last_backward=True)
    # 8 idle slots, less the update's gradient and the second sub-group's gradient on file: 6 for sub-groups 1-3
    assert ahead.in_backward == 6
    taken = {group.param_id: list(ahead.take(group.param_id)) for group in groups}
    assert taken == {"0": [], "1": all_paths(groups[1]), "2": all_paths(groups[2]), "3": []}
    for paths in taken.values():
        for path in paths:
            store.wait_read(path)
            store.release(path)
    store.close()


def test_the_first_sub_group_is_read_ahead_once_the_last_updates_writes_behind_are_done(tmp_path):
    """Regression: the last update's writes behind, done during the forward pass but not reaped, left the first
    sub-group's entries WRITING when the backward began, and the backward read none of them ahead: with one
    sub-group (a 25% budget, or streaming) its whole state was read in the update while the drive idled through the
    backward (gpt2-small fp32 at 560 MB: 0.42 s of waiting a step)."""
    io = DirectFileIO(num_threads=1)  # one worker: a request done means every earlier one is done
    store = make(io)
    try:
        [group] = sub_groups_on_file(store, tmp_path, 1)
        warm_slots(store, tmp_path)
        for index, path in enumerate(all_paths(group)):  # the last update: lent, stepped, given back, written behind
            store.lend(path).fill_(100 + index)
        for path in all_paths(group):
            store.release(path, changed=True)
        io.write(torch.zeros(NUMEL), str(tmp_path / "after-the-writes.swp")).result()
        assert [store.state(path) for path in all_paths(group)] == [EntryState.WRITING] * 3  # done, not reaped
        ahead = ReadsAhead(store, all_paths, lambda group: None)
        ahead.during_backward([group], lent={}, last_backward=True)
        assert list(ahead.take("0")) == all_paths(group)
        for index, path in enumerate(all_paths(group)):
            assert torch.all(store.wait_read(path) == 100 + index)  # the bytes written behind
            store.release(path)
    finally:
        store.close()
        io.close()


class GatedWrites:
    """The real engine with its writes held until ``gate`` is set: a write in flight for as long as a test needs."""

    def __init__(self, io):
        self.io, self.gate = io, threading.Event()
        self.gate.set()
        self._writer = concurrent.futures.ThreadPoolExecutor(1)

    def write(self, *args, **kwargs):
        return self._writer.submit(lambda: (self.gate.wait(), self.io.write(*args, **kwargs).result())[1])

    def drain(self):
        self._writer.shutdown(wait=True)

    def __getattr__(self, name):
        return getattr(self.io, name)


def test_state_still_being_written_when_the_backward_begins_is_read_once_written_never_waiting(io, tmp_path):
    """The last update's writes behind still in flight when the backward begins (a forward pass shorter than them):
    their reads start at the first ``after_writes`` after they are done (the backward calls it at each gradient),
    and a call before that returns at once (one that waited would hang here: the writes are held until it returns;
    the gate opens at the end whatever happens, so a failure fails)."""
    gated = GatedWrites(io)
    store = make(gated)
    try:
        [group] = sub_groups_on_file(store, tmp_path, 1)
        warm_slots(store, tmp_path)
        for index, path in enumerate(all_paths(group)):
            store.lend(path).fill_(100 + index)
        gated.gate.clear()
        for path in all_paths(group):
            store.release(path, changed=True)  # written behind, held at the gate
        ahead = ReadsAhead(store, all_paths, lambda group: None)
        ahead.during_backward([group], lent={}, last_backward=True)
        ahead.during_backward([group], lent={}, last_backward=True)  # gradient accumulation: another backward
        ahead.after_writes()  # the writes are in flight: nothing to start, and no wait
        assert [store.state(path) for path in all_paths(group)] == [EntryState.WRITING] * 3
        gated.gate.set()
        gated.drain()
        ahead.after_writes()
        assert ahead.after_their_writes == 3  # each once
        assert list(ahead.take("0")) == all_paths(group)
        for index, path in enumerate(all_paths(group)):
            assert torch.all(store.wait_read(path) == 100 + index)
            store.release(path)
        ahead.after_writes()  # nothing left waiting
        assert ahead.after_their_writes == 3
    finally:  # whatever failed: the writes let through and their thread ended before the store and engine close
        gated.gate.set()
        gated.drain()
        store.close()
