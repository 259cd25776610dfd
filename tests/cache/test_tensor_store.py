"""TensorStore (parameter partitions) on real files and real arena slots: bytes survive every path; a shortage
evicts, waits for one write or falls back; the defects of the flags-plus-futures store stay fixed. Every test runs
with the store's invariant checks after each call (TENCACHE_DEBUG_CHECKS)."""
import contextlib
import os
import threading
import time

import pytest
import torch

from tencache_ds.cache.entry import EntryState
from tencache_ds.cache.host_budget import HostBudget
from tencache_ds.cache.tensor_store import TensorStore
from tencache_ds.io.direct_io import DirectFileIO


@pytest.fixture(autouse=True)
def debug_checks(monkeypatch):
    monkeypatch.setenv("TENCACHE_DEBUG_CHECKS", "1")


def aligned(numel):  # DeepSpeed's 1 KiB alignment for fp32
    return -(-numel // 256) * 256


def make_store(tmp_path, slots_per_class=2, cache_bytes=0):
    io = DirectFileIO(num_threads=2)
    store = TensorStore(str(tmp_path), torch.float32, aligned, slots_per_class=slots_per_class, lock="best_effort",
                        io=io, cache_budget=HostBudget(cache_bytes))
    store.test_io = io
    return store


@pytest.fixture
def store(tmp_path):
    store = make_store(tmp_path)
    yield store
    store.close()
    store.test_io.close()


@pytest.fixture
def caching_store(tmp_path):
    store = make_store(tmp_path, slots_per_class=1, cache_bytes=2 * aligned(300_000) * 4 + 4096)
    yield store
    store.close()
    store.test_io.close()


def create(store, key, numel, seed):
    """zero.Init's path: staging buffer, fill, write, release."""
    view = store.staging_view(key, numel)
    view.copy_(torch.randn(numel, generator=torch.Generator().manual_seed(seed)))
    expected = view.clone()
    store.write_and_release([key])
    return expected


def read(store, key):
    store.start_read(key)
    value = store.wait_read(key).clone()
    store.release(key)
    return value


def test_create_read_release_round_trip(store):
    expected = {key: create(store, key, 300_000 + key, seed=key) for key in range(5)}
    store.plan()
    assert store.stats()["num_classes"] >= 1
    for key in range(5):
        store.start_read(key)
    for key in range(5):  # 5 reads with 2 slots per class: the rest fall back, nothing asserts
        assert torch.equal(store.wait_read(key), expected[key])
    stats = store.stats()
    assert stats["buffer_fallbacks"] >= 1 and stats["resident_tensors"] == 5 and store.lent_or_reading() == 5
    for key in range(5):
        store.release(key)
        store.release(key)  # idempotent
    assert store.stats()["resident_tensors"] == 0 and store.pool.stats()["fallback_bytes_in_use"] == 0


def test_write_from_is_visible_to_the_next_read(store):
    create(store, "w", 100_000, seed=1)
    store.plan()
    new = torch.randn(100_000, dtype=torch.float64)
    store.write_from("w", new)          # cast to fp32; streaming: written at once, asynchronously
    assert torch.equal(read(store, "w"), new.float())


def test_streaming_writes_hold_slots_until_done_then_give_them_back(store):
    for key in range(4):
        create(store, key, 200_000, seed=key)
    store.plan()
    for key in range(4):
        store.write_from(key, torch.full((200_000,), float(key)))
    assert store.counters.transient_buffers == 0  # 2 slots, 4 writes: later ones waited for (or reaped) earlier ones
    store.flush()
    assert store.pool.stats()["in_use_bytes"] == 0
    for key in range(4):
        dest = torch.empty(200_000)
        store.read_into(key, dest)
        assert torch.all(dest == key)


def test_a_write_done_since_is_reaped_before_a_read_ahead_is_refused(store):
    """A partition the update rewrote is read ahead for the next step once its write is done (param_swapper.py
    ``_read_ahead_for_next_step``): the store reaps the writes done before it looks at the entry, which otherwise
    still showed "writing" and was refused until some later call reaped it."""
    create(store, "w", 100_000, seed=1)
    store.plan()
    store.write_from("w", torch.full((100_000,), 7.0))  # streaming: written at once, asynchronously
    assert store.state("w") is EntryState.WRITING
    deadline = time.monotonic() + 30
    write = store.entries._table["w"].io  # the write in flight (the store's own record of it)
    while not write.done() and time.monotonic() < deadline:
        time.sleep(0.01)  # done on the drive; the entry says so only once reaped
    assert store.prefetch_if_free("w")
    assert torch.all(store.wait_read("w") == 7.0)
    store.release("w")


def test_caller_buffer_read(store):
    expected = create(store, "c", 50_000, seed=3)
    into = torch.empty(aligned(50_000))
    store.start_read("c", into=into)
    assert torch.equal(store.wait_read("c"), expected)
    store.release("c")
    assert store.state("c") == EntryState.ON_FILE


def test_a_store_made_without_a_host_cache_keeps_no_copy_in_a_free_slot_and_says_so(store, caching_store):
    """Streaming (no host cache): a partition read and released leaves its slot free, and the next use reads the
    file again; the stats say the store keeps no copy (the bench's least bytes then count no slot as room,
    bench/report_bound.py). A store made with a cache says it does."""
    expected = create(store, 0, 200_000, seed=0)
    store.plan()
    assert torch.equal(read(store, 0), expected) and torch.equal(read(store, 0), expected)
    assert store.counters.misses == 2 and store.counters.hits == 0  # two slots, one tensor: still no copy kept
    assert store.state(0) == EntryState.ON_FILE and store.pool.stats()["buffer_fallbacks"] == 0  # read into slots
    assert store.stats()["keeps_copies"] == 0
    assert caching_store.stats()["keeps_copies"] == 1


def test_cache_hits_are_zero_copy_and_evict_least_recently_used(caching_store):
    """4 tensors, 1 streaming slot + room for ~2 cached copies: the second pass hits for the recent ones, and a
    hit lends the cached buffer itself."""
    store = caching_store
    expected = {key: create(store, key, 300_000, seed=key) for key in range(4)}
    store.plan()
    for key in range(4):  # first pass: all misses, each released into the cache
        assert torch.equal(read(store, key), expected[key])
    assert store.counters.misses == 4 and store.counters.evictions >= 1
    reads_before = store.test_io.counters().read_requests
    store.start_read(3)  # most recently used: still cached
    first = store.wait_read(3)
    store.release(3)
    store.start_read(3)
    assert store.wait_read(3).data_ptr() == first.data_ptr()  # the same memory: no copy
    store.release(3)
    assert store.counters.hits == 2 and store.test_io.counters().read_requests == reads_before
    assert torch.equal(read(store, 0), expected[0])  # least recently used: evicted, read again, bytes right
    assert store.counters.misses == 5
    assert store.pool.stats()["buffer_fallbacks"] == 0


def test_write_back_keeps_new_bytes_in_memory_until_evicted(caching_store):
    store = caching_store
    create(store, "p", 300_000, seed=5)
    for key in range(3):
        create(store, key, 300_000, seed=10 + key)
    store.plan()
    read(store, "p")  # now cached
    writes_before = store.test_io.counters().write_requests
    new = torch.randn(300_000)
    store.write_from("p", new)
    assert store.state("p") == EntryState.DIRTY
    assert store.test_io.counters().write_requests == writes_before  # nothing reached the file yet
    assert torch.equal(read(store, "p"), new) and store.counters.hits == 1
    for key in range(3):  # push "p" out: its bytes are written on eviction
        read(store, key)
    assert store.state("p") == EntryState.ON_FILE
    assert torch.equal(read(store, "p"), new)


def test_bytes_changed_in_place_while_lent_are_the_newest_and_reach_the_file(caching_store):
    """Defect: a partition that stage 3 updated in place while its write was still attached stayed cached as a
    clean copy whose bytes the file did not have; once evicted, the older file bytes came back. Now the lent bytes
    are marked changed, kept dirty, and written when evicted."""
    store = caching_store
    create(store, "r", 300_000, seed=9)
    for key in range(3):
        create(store, key, 300_000, seed=key)
    store.plan()
    store.write_from("r", torch.randn(300_000))  # new weights...
    store.flush()                                 # ...on file, and the cached copy clean
    store.start_read("r")
    view = store.wait_read("r")
    store.mark_all_lent_changed()
    view.fill_(3.0)  # the owner writes in place
    store.release("r")
    store.flush()
    on_file = torch.empty(300_000)
    store.test_io.read(on_file, store.path_of("r")).result()
    assert torch.all(on_file == 3.0)  # the file agrees with what is served
    for key in range(3):
        read(store, key)
    assert torch.all(read(store, "r") == 3.0)


def test_a_failed_write_on_eviction_keeps_the_bytes_and_the_slot_accounted(caching_store, tmp_path):
    """Defect: an eviction whose write failed orphaned the slot and dropped the only copy of the new bytes."""
    store = caching_store
    create(store, "e", 300_000, seed=1)
    for key in range(3):
        create(store, key, 300_000, seed=key)
    store.plan()
    new = torch.randn(300_000)
    store.write_from("e", new)
    path = store.path_of("e")
    os.remove(path)
    os.mkdir(path)  # writes to the file now fail (EISDIR)
    with pytest.raises(OSError):
        for key in range(3):
            read(store, key)
    assert store.state("e") == EntryState.DIRTY
    store.check_invariants()
    os.rmdir(path)  # the disk is fixed: the bytes were never lost
    store.flush()
    assert torch.equal(read(store, "e"), new)


def test_a_failed_read_leaves_no_partial_copy_behind(store):
    create(store, "f", 100_000, seed=4)
    store.plan()
    os.remove(store.path_of("f"))
    store.start_read("f")
    with pytest.raises(Exception, match="missing"):
        store.wait_read("f")
    assert store.state("f") == EntryState.ON_FILE and store.pool.stats()["in_use_bytes"] == 0
    assert store.lent_or_reading() == 0


def test_a_small_tensor_never_takes_a_larger_class_slot(tmp_path):
    """Defect: with its own class full, a small partition got the large class's slot, and the largest partition
    then fell back to pageable (unpinned) memory."""
    store = make_store(tmp_path, slots_per_class=1)
    try:
        for key, numel in (("s1", 20_000), ("s2", 20_000), ("big", 400_000)):
            create(store, key, numel, seed=1)
        store.plan()
        for key in ("s1", "s2", "big"):
            store.start_read(key)
        stats = store.pool.stats()
        assert stats["buffer_fallbacks"] == 1
        assert stats["fallback_bytes_peak"] < aligned(400_000) * 4  # the small one fell back, not the big one
        for key in ("s1", "s2", "big"):
            store.wait_read(key)
            store.release(key)
    finally:
        store.close()
        store.test_io.close()


def _wait_for_state(store, key, state, timeout):
    """Wait until ``key``'s write outcome is applied (its failed write leaves it DIRTY)."""
    deadline = time.monotonic() + timeout
    while store.state(key) != state and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            store.flush_key(key)
        time.sleep(0.05)


def _blocked_fifo(path):
    """Replace ``path`` with a FIFO: I/O on it blocks until the other end is opened."""
    os.remove(path)
    os.mkfifo(path)


def _unblock(path, wait_for_io):
    """Open the FIFO at both ends (never blocks), so the I/O blocked on it gets past open() (and then fails: a
    FIFO cannot be read or written at an offset); keep it open until ``wait_for_io`` returns."""
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    try:
        wait_for_io(10)
    finally:
        os.close(fd)


def test_waiting_for_a_read_does_not_hold_the_store_lock(store):
    """Defect: wait_read held the store's lock while waiting for I/O, so every other call (another thread's
    prefetch, stats) stalled behind it."""
    create(store, "slow", 50_000, seed=1)
    create(store, "other", 50_000, seed=2)
    store.plan()
    path = store.path_of("slow")
    _blocked_fifo(path)
    store.start_read("slow")
    waiter = threading.Thread(target=lambda: pytest.raises(Exception, store.wait_read, "slow"), daemon=True)
    waiter.start()
    done = threading.Event()

    def other_call():
        read(store, "other")
        done.set()

    threading.Thread(target=other_call, daemon=True).start()
    try:
        assert done.wait(10), "another tensor's read waited for the lock held across I/O"
    finally:
        _unblock(path, waiter.join)


def test_a_shortage_waits_for_the_one_write_that_frees_a_slot(tmp_path):
    """Defect: a reader short of a slot waited for *all* writes in flight, however unrelated."""
    store = make_store(tmp_path, slots_per_class=1)
    try:
        create(store, "big", 400_000, seed=1)
        create(store, "small", 20_000, seed=2)
        create(store, "small2", 20_000, seed=3)
        store.plan()
        _blocked_fifo(store.path_of("big"))
        store.write_from("big", torch.zeros(400_000))     # its write blocks until the FIFO is read
        store.write_from("small", torch.ones(20_000))     # holds the only small slot until written
        done = threading.Event()
        threading.Thread(target=lambda: (read(store, "small2"), done.set()), daemon=True).start()
        try:
            assert done.wait(10), "the read waited for an unrelated write"
        finally:
            _unblock(store.path_of("big"), lambda timeout: _wait_for_state(store, "big", EntryState.DIRTY, timeout))
        assert torch.all(read(store, "small") == 1.0)
    finally:
        store.close()
        store.test_io.close()


def test_cache_slots_fit_the_memlock_limit_after_the_streaming_slots(tmp_path):
    """4 partitions of 1.2 MB, 1 streaming slot, a budget for all of them, but the process may lock only one
    streaming slot plus one more: the plan keeps the streaming slot and one cache slot, and says why."""
    slot = aligned(300_000) * 4
    slot = -(-slot // 4096) * 4096
    io = DirectFileIO(num_threads=2)
    store = TensorStore(str(tmp_path), torch.float32, aligned, slots_per_class=1, lock="best_effort", io=io,
                        cache_budget=HostBudget(10 * slot), lockable_bytes=lambda: 2 * slot + 100)
    try:
        for key in range(4):
            create(store, key, 300_000, seed=key)
        store.plan()
        assert store.streaming_bytes_reserved == slot
        assert store.cache_bytes_reserved == slot
        assert store.pool.stats()["reserved_bytes"] == 2 * slot
    finally:
        store.close()
        io.close()


def test_a_partition_handed_over_to_deepspeed_keeps_no_copy_and_no_slot(tmp_path):
    """stage 3 moves partitions into its own CPU buffer (max_in_cpu) after zero.Init planned slots for all: the
    handed-over ones leave no cached copy; once the hand-overs are over the slots go back and the arena is planned
    again for the rest only (not after each: it was mapped anew for every partition handed over), and after the
    last one every slot and the cache budget are given back."""
    budget = HostBudget(64 << 20)
    io = DirectFileIO(num_threads=2)
    store = TensorStore(str(tmp_path), torch.float32, aligned, slots_per_class=1, lock="best_effort", io=io,
                        cache_budget=budget)
    try:
        expected = {key: create(store, key, 300_000 if key < 3 else 100_000, seed=key) for key in range(4)}
        store.plan()
        for key in range(4):
            read(store, key)  # zero.Init's gathers: every partition now has a cached copy
        assert store.stats()["cached_bytes"] > 0 and budget.used_bytes > 0
        mapped = store.pool.stats()["reserved_bytes"]
        for key in range(3):  # the 1.2 MB partitions go to DeepSpeed's buffer, one after the other
            dest = torch.empty(300_000)
            store.read_into(key, dest)
            store.hand_over(key)
            assert torch.equal(dest, expected[key]) and not store.knows(key)
            assert store.pool.stats()["reserved_bytes"] == mapped  # the arena is not mapped anew for each
        assert store.give_back_slots()  # once they are over
        stats = store.stats()
        assert stats["cached_bytes"] == 0 and stats["in_use_bytes"] == 0 and stats["reserved_bytes"] == 0
        assert budget.used_bytes == 0
        store.plan()  # slots for the one partition still swapped, of its own size only
        assert store.pool.stats()["reserved_bytes"] == store.pool.class_bytes(store.swap_nbytes(100_000))
        assert torch.equal(read(store, 3), expected[3])
        store.hand_over(3)
        assert store.give_back_slots()
        assert store.pool.stats()["reserved_bytes"] == 0 and budget.used_bytes == 0
    finally:
        store.close()
        io.close()


def test_a_smaller_cache_retires_its_slots_and_gives_the_memory_back_then_takes_it_again(tmp_path):
    """Memory pressure (integrations/deepspeed/memory_pressure.py): 6 partitions, 1 streaming slot, cache slots for
    all of them. Shrinking to two cache slots retires free ones first, then evicts held partitions (a dirty one is
    written first: its new bytes are on file afterwards), never a lent one and never the streaming slot; growing
    brings the slots back. Every byte read afterwards is the newest."""
    slot = -(-aligned(300_000) * 4 // 4096) * 4096
    io = DirectFileIO(num_threads=2)
    store = TensorStore(str(tmp_path), torch.float32, aligned, slots_per_class=1, lock="best_effort", io=io,
                        cache_budget=HostBudget(5 * slot))
    try:
        expected = {key: create(store, key, 300_000, seed=key) for key in range(6)}
        store.plan()
        assert store.cache_bytes_reserved == store.planned_cache_bytes == 5 * slot
        for key in range(4):
            read(store, key)                      # 0..3 held clean
        new = torch.randn(300_000)
        store.write_from(3, new)                  # 3 held dirty (write-back)
        expected[3] = new
        store.start_read(5)
        lent = store.wait_read(5)                 # 5 lent (its slot cannot go now)
        resident = store.pool.stats()["reserved_bytes"] - store.pool.stats()["retired_bytes"]

        assert store.resize_cache(2 * slot) == 2 * slot
        assert store.pool.stats()["retired_bytes"] == 3 * slot
        assert store._budget.used_bytes == 2 * slot and store._budget.total_bytes == 2 * slot
        assert store.streaming_bytes_reserved == slot
        assert store.state(5) == EntryState.LENT_CLEAN and torch.equal(lent, expected[5])
        assert len(store.held_keys()) == 2         # 5 partitions need slots: 3 of them in files now
        on_file = torch.empty(aligned(300_000))
        io.read(on_file, store.path_of(3)).result()
        if store.state(3) == EntryState.ON_FILE:  # evicted: its new bytes were written first
            assert torch.equal(on_file[:300_000], new)
        assert resident - (store.pool.stats()["reserved_bytes"] - store.pool.stats()["retired_bytes"]) == 3 * slot
        store.release(5)

        assert store.resize_cache(0) == 0          # everything but the streaming slot (which may hold a copy)
        assert store.pool.stats()["retired_bytes"] == 5 * slot and len(store.held_keys()) <= 1
        for key in range(6):                       # streaming through one slot: every byte still right
            assert torch.equal(read(store, key), expected[key])

        assert store.resize_cache(10 * slot) == 5 * slot  # never past what was planned
        assert store.pool.stats()["retired_bytes"] == 0
        for key in range(6):
            assert torch.equal(read(store, key), expected[key])
        assert len(store.held_keys()) == 6 and store.counters.transient_buffers == 0
        store.check_invariants()
    finally:
        store.close()
        io.close()


def test_the_cache_bytes_it_could_give_back_leave_out_slots_lent_for_good(tmp_path):
    """Regression test (helper-208's review): persistent parameters on NVMe stay lent in their slots for the whole
    run (on a host accelerator), and slots lent or read into are freed by no eviction; ``reducible_cache_bytes`` was
    every committed cache byte, so the governor never found the tier exhausted, "gave back" bytes it could not free
    at every reading, and the OOM killer ended the run. It is what ``resize_cache`` frees."""
    slot = -(-aligned(300_000) * 4 // 4096) * 4096
    io = DirectFileIO(num_threads=2)
    store = TensorStore(str(tmp_path), torch.float32, aligned, slots_per_class=1, lock="best_effort", io=io,
                        cache_budget=HostBudget(5 * slot))
    try:
        for key in range(6):
            create(store, key, 300_000, seed=key)
        store.plan()
        assert store.reducible_cache_bytes == 5 * slot  # nothing lent: every cache slot can go
        for key in range(6):
            store.start_read(key)
            store.wait_read(key)                  # all 6 slots lent (1 streaming + 5 cache)
        assert store.reducible_cache_bytes == 0
        store.release(0)
        store.release(1)                          # two held: evicted, their slots can go
        reducible = store.reducible_cache_bytes
        assert reducible == 2 * slot
        assert store.resize_cache(0) == 5 * slot - reducible
        for key in range(2, 6):
            store.release(key)
        store.check_invariants()
    finally:
        store.close()
        io.close()


def test_a_later_plan_keeps_a_size_merged_into_a_class_in_that_class(tmp_path):
    """Regression test (helper-211's review): a plan merged 400 KiB partitions into a 440 KiB class; a later plan of
    new 400 KiB partitions (registered after the first gathers) made a 400 KiB class, which became the earlier
    ones' own class too (the smallest that fits): they stopped using the slots planned for them. A later size is
    planned in an earlier class that holds it."""
    small, large = 102_400, 112_640  # fp32 elements: 400 and 440 KiB
    io = DirectFileIO(num_threads=2)
    store = TensorStore(str(tmp_path), torch.float32, aligned, slots_per_class=2, lock="best_effort", io=io,
                        cache_budget=HostBudget(0))
    try:
        for key in range(4):
            create(store, key, small if key % 2 else large, seed=key)
        store.plan()
        [merged] = store.pool.class_sizes()
        create(store, 10, small, seed=10)
        store.plan()
        assert store.pool.class_sizes() == [merged]
        assert store.pool.class_bytes(small * 4) == merged
    finally:
        store.close()
        io.close()


_PLAN_REFUSED_CHILD = """
import json, resource, sys
import torch
sys.path.insert(0, sys.argv[2])
from test_tensor_store import aligned, create
from tencache_ds.cache.host_budget import HostBudget
from tencache_ds.cache.tensor_store import TensorStore
from tencache_ds.io.direct_io import DirectFileIO

from tencache_ds.memory import _native
_native.lib()  # loaded before the limit (a load refused under it would be remembered)
budget, io = HostBudget(64 << 20), DirectFileIO(num_threads=2)
# lock "off": the cache's room does not depend on this machine's memlock limit
store = TensorStore(sys.argv[1], torch.float32, aligned, slots_per_class=1, lock="off", io=io,
                    cache_budget=budget)
expected = {key: create(store, key, 300_000 + key, seed=key) for key in range(3)}
with open("/proc/self/status") as status:
    mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped + (2 << 20), hard))  # the plan's arena (about 7 MB) cannot be mapped
result = {}
try:
    store.plan()
except (MemoryError, OSError) as err:
    result["refused"] = f"{type(err).__name__}: {err}"[:200]
result["budget_used"], result["cache_reserved"] = budget.used_bytes, store.cache_bytes_reserved
result["budget_peak"] = budget.peak_bytes  # the plan did reserve cache slots before the pool refused them
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))  # room again: the same sizes are planned now
store.plan()
result["planned_classes"] = store.stats()["num_classes"]
result["cache_reserved_after"] = store.cache_bytes_reserved
store.start_read(1)
result["read_back"] = bool(torch.equal(store.wait_read(1), expected[1]))
store.release(1)
store.close()
io.close()
print(json.dumps(result))
"""


def test_a_plan_whose_slots_cannot_be_made_takes_nothing_and_plans_the_same_sizes_next_time(tmp_path):
    """The kernel refused the mapping of the plan's slots (here: an address-space limit just above what the process
    maps; or "required" locking under a memlock limit). The plan had already taken the cache's budget and recorded
    the slots and the sizes as planned: the budget stayed taken for slots that never existed, and the sizes were
    never planned again (their partitions then always went to pageable fallback memory)."""
    import json
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    proc = subprocess.run([sys.executable, "-c", _PLAN_REFUSED_CHILD, str(tmp_path), here], cwd=repo,
                          env=dict(os.environ, PYTHONPATH=repo), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["refused"]
    assert result["budget_peak"] > 0 and result["budget_used"] == 0 and result["cache_reserved"] == 0
    assert result["planned_classes"] >= 1 and result["cache_reserved_after"] > 0 and result["read_back"]


def test_the_updates_writes_keep_the_partitions_needed_sooner(caching_store):
    """Regression (helper-189's review): a write of new bytes (the update's, stage 3's partitions in forward order)
    is no use, yet it took a slot from a held partition the next forward needs sooner than the written one: each
    update rotated the held set, and the forward read one back behind a write (gpt2-small fp32 at a 150 MB budget:
    16.5 MB more read and written a step, 35 evictions a step against 22). Now a write keeps what is needed sooner
    and goes to its file through a transient buffer."""
    from tencache_ds.profile.next_use import NextUseIndex
    store = caching_store
    for key in range(5):
        create(store, key, 300_000, seed=key)
    store.plan()
    for key in (0, 1):  # the next forward's first two: held
        read(store, key)
    assert {store.state(key) for key in (0, 1)} == {EntryState.CLEAN}
    store.start_read(4)
    store.wait_read(4)  # lent through the update: the streaming slot is taken
    store.recorder.end_step()  # the update: positions start over at the next step's first access
    store.next_use = NextUseIndex([0, 1, 2, 3, 4])
    new = {key: torch.randn(300_000) for key in (2, 3)}
    for key in (2, 3):  # needed after 0 and 1
        store.write_from(key, new[key])
    store.release(4)
    store.flush()
    assert [store.state(key) for key in (0, 1)] == [EntryState.CLEAN] * 2  # still held: the next forward hits
    assert all(torch.equal(read(store, key), new[key]) for key in (2, 3))


def test_on_a_kernel_with_64_kib_pages_the_cache_plans_the_arenas_slot_sizes(tmp_path, monkeypatch):
    """helper-235: the arena makes every slot whole 64 KiB pages where the kernel's are (memory/arena.py), while the
    store planned its classes in 4 KiB units and looked its slots up by them: KeyError at the governor's first
    reading (reducible_cache_bytes) and at resize_cache. Forced through the page-size test hook."""
    from tencache_ds.units import ARENA_PAGE_ENV
    monkeypatch.setenv(ARENA_PAGE_ENV, str(64 * 1024))
    store = make_store(tmp_path, slots_per_class=1, cache_bytes=64 << 20)
    try:
        expected = {key: create(store, key, 300_000, seed=key) for key in range(4)}
        store.plan()
        assert all(size % (64 * 1024) == 0 for size in store.pool.class_slots())
        for key in range(4):
            assert torch.equal(read(store, key), expected[key])
        assert store.reducible_cache_bytes > 0
        assert store.resize_cache(0) == 0
        for key in range(4):
            assert torch.equal(read(store, key), expected[key])
    finally:
        store.close()
        store.test_io.close()


def test_later_plans_add_no_streaming_slots_a_class_already_has(tmp_path):
    """helper-235: every plan added a whole set of streaming slots for its sizes, whatever earlier plans had made
    for the same class: a model gathered a layer at a time under zero.Init (each gather plans the sizes registered
    so far) had buffer_count slots per class per layer, the whole model in slots beyond any budget."""
    io = DirectFileIO(num_threads=2)
    store = TensorStore(str(tmp_path), torch.float32, aligned, slots_per_class=4, lock="best_effort", io=io,
                        cache_budget=HostBudget(0))
    try:
        expected = {}
        for layer in range(6):
            for key in range(4 * layer, 4 * layer + 4):
                expected[key] = create(store, key, 262_144, seed=key)
            store.plan()
        assert {size: slots["slots"] for size, slots in store.pool.class_slots().items()} == {1 << 20: 4}
        for key, value in expected.items():
            assert torch.equal(read(store, key), value)
        create(store, 100, 262_144 * 2, seed=100)  # a new size: its own streaming slot
        store.plan()
        assert {size: slots["slots"] for size, slots in store.pool.class_slots().items()} == {1 << 20: 4, 2 << 20: 1}
    finally:
        store.close()
        io.close()


def test_a_store_put_to_rest_after_memory_pressure_plans_its_cache_from_the_whole_budget_again(tmp_path):
    """helper-235: memory pressure lowers the cache's budget (resize_cache); the engine's destroy puts the store to
    rest (give_back_slots) and a new engine over the same model plans it anew, but from the lowered budget, with a
    governor of its own that never raises it: the rebuilt engine streamed for good. Its wake restores the budget."""
    store = make_store(tmp_path, slots_per_class=1, cache_bytes=64 << 20)
    try:
        for key in range(4):
            create(store, key, 300_000, seed=key)
        store.plan()
        planned = store.planned_cache_bytes
        assert planned > 0
        assert store.resize_cache(0) == 0
        assert store.give_back_slots()
        store.restore_budget()
        store.plan()
        assert store.planned_cache_bytes == planned
    finally:
        store.close()
        store.test_io.close()
