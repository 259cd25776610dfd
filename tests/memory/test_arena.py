"""Tests of the pinned-buffer arena: PinnedArena over the real native library, and the C test driver.

No mocks. The arena tests fail (they do not skip) when the library is not built, unless the build was
turned off on purpose with TENCACHE_BUILD_NATIVE=0. Build it with `python setup.py build_ext --inplace`.
"""
import concurrent.futures
import ctypes
import gc
import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from tencache_ds.errors import TencacheConfigError
from tencache_ds.memory import PinnedArena, native_available, native_unavailable_reason
from tencache_ds.memory._native import native_build_disabled

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE = 4096
KiB, MiB = 1024, 1024 * 1024


@pytest.fixture
def make_arena():
    """PinnedArena factory (lock="off" unless asked) that closes every arena at teardown."""
    if native_build_disabled():
        pytest.skip("TENCACHE_BUILD_NATIVE=0: native arena not built on purpose")
    if not native_available():
        pytest.fail(f"native arena not available: {native_unavailable_reason()}")
    arenas = []

    def make(class_counts, lock="off", **kwargs):
        arena = PinnedArena(class_counts, lock=lock, **kwargs)
        arenas.append(arena)
        return arena

    yield make
    for arena in arenas:
        arena.close()


def test_native_library_loads(make_arena):
    assert native_available()
    assert native_unavailable_reason() is None


def test_classes_are_rounded_merged_and_sorted(make_arena):
    # 8192 x 1 and 5000 -> 8192 x 2 merge; 100 -> 4096 x 3 merges with 4096 x 1.
    arena = make_arena({8192: 1, 5000: 2, 100: 3, 4096: 1})
    assert arena.classes == [(4096, 4), (8192, 3)]
    stats = arena.stats()
    assert stats["reserved_bytes"] == 4 * 4096 + 3 * 8192
    assert stats["class.4096.slots"] == 4 and stats["class.8192.slots"] == 3


def test_every_slot_is_page_aligned_and_disjoint(make_arena):
    arena = make_arena({1: 3, 4097: 3, 70000: 2})
    slots = [arena.alloc(n) for n in (1, 1, 1, 4097, 4097, 4097, 70000, 70000)]
    assert all(slot is not None for slot in slots)
    for slot in slots:
        assert slot.ptr % PAGE == 0 and slot.slot_bytes % PAGE == 0 and slot.nbytes <= slot.slot_bytes
    spans = sorted((slot.ptr, slot.ptr + slot.slot_bytes) for slot in slots)
    assert all(end <= next_start for (_s, end), (next_start, _e) in zip(spans, spans[1:]))


def test_regions_hold_the_slots_of_their_class(make_arena):
    arena = make_arena({4 * KiB: 3, 64 * KiB: 2})
    regions = arena.regions()
    assert [nbytes for _base, nbytes in regions] == [3 * 4 * KiB, 2 * 64 * KiB]
    assert arena.free_slots() == 5
    slots = [arena.alloc(n) for n in (1, 1, 5000)]
    assert arena.free_slots() == 2
    for slot in slots:
        base, nbytes = regions[slot.size_class]
        assert base <= slot.ptr and slot.ptr + slot.slot_bytes <= base + nbytes
        assert slot.arena is arena


def test_alloc_takes_the_smallest_class_with_a_free_slot(make_arena):
    arena = make_arena({4 * KiB: 2, 64 * KiB: 2, 1 * MiB: 1})
    assert arena.alloc(4096).size_class == 0
    assert arena.alloc(4097).slot_bytes == 64 * KiB
    assert arena.alloc(1).size_class == 0                 # class 0 now full
    spilled = arena.alloc(1)
    assert spilled.size_class == 1 and spilled.slot_bytes == 64 * KiB
    assert arena.alloc(64 * KiB + 1).slot_bytes == 1 * MiB


def test_freed_slot_is_reused(make_arena):
    arena = make_arena({8 * KiB: 4})
    first, second = arena.alloc(100), arena.alloc(100)
    assert second.ptr == first.ptr + 8 * KiB              # fresh arena: ascending addresses
    arena.free(first)
    assert arena.alloc(100).ptr == first.ptr


def test_exhaustion_returns_none_and_is_counted(make_arena):
    arena = make_arena({4 * KiB: 2})
    assert arena.alloc(10) is not None and arena.alloc(10) is not None
    assert arena.alloc(10) is None
    assert arena.alloc(4 * KiB + 1) is None               # larger than every class
    assert arena.stats()["failed_allocs"] == 2


def test_double_free_raises_even_after_the_slot_was_reused(make_arena):
    arena = make_arena({4 * KiB: 2})
    slot = arena.alloc(10)
    arena.free(slot)
    with pytest.raises(ValueError, match="double free"):
        arena.free(slot)
    # Regression guard: a stale handle must not free the slot's next owner.
    new_owner = arena.alloc(10)
    assert new_owner.ptr == slot.ptr
    with pytest.raises(ValueError):
        arena.free(slot)
    assert arena.stats()["in_use_bytes"] == 4 * KiB
    arena.free(new_owner)
    arena.validate()


def test_free_of_a_foreign_slot_raises(make_arena):
    mine, other = make_arena({4 * KiB: 2}), make_arena({4 * KiB: 2})
    foreign = other.alloc(10)
    with pytest.raises(ValueError, match="not handed out by this arena"):
        mine.free(foreign)
    other.free(foreign)                                   # still live and owned by `other`
    with pytest.raises(ValueError):
        mine.free("not a slot")


@pytest.mark.parametrize("nbytes", [0, -1, 1.5, True, 2**64])
def test_alloc_rejects_bad_sizes(make_arena, nbytes):
    arena = make_arena({4 * KiB: 1})
    with pytest.raises(ValueError):
        arena.alloc(nbytes)


@pytest.mark.parametrize("class_counts, lock", [
    ({}, "off"), ({4096: 0}, "off"), ({0: 1}, "off"), ({4096: 1.0}, "off"), ({4096: 1}, "maybe"),
    ({4096 * (i + 1): 1 for i in range(65)}, "off"),
])
def test_bad_arguments_raise_config_errors(make_arena, class_counts, lock):
    with pytest.raises(TencacheConfigError):
        make_arena(class_counts, lock=lock)


def test_stats_track_in_use_peak_and_requested(make_arena):
    arena = make_arena({4 * KiB: 4, 16 * KiB: 2})
    small, big, full = arena.alloc(1000), arena.alloc(10000), arena.alloc(4096)
    stats = arena.stats()
    assert stats["in_use_bytes"] == 4096 + 16384 + 4096
    assert stats["requested_in_use_bytes"] == 1000 + 10000 + 4096
    assert stats["peak_in_use_bytes"] == stats["in_use_bytes"]
    arena.free(big)
    stats = arena.stats()
    assert stats["in_use_bytes"] == 8192 and stats["requested_in_use_bytes"] == 5096
    assert stats["peak_in_use_bytes"] == 4096 + 16384 + 4096
    assert stats["allocs"] == 3 and stats["frees"] == 1
    assert stats["class.16384.in_use"] == 0 and stats["class.16384.peak_in_use"] == 1
    assert stats["class.4096.in_use"] == 2
    extra = arena.alloc(1)                                # below the old peak: the peak stays
    assert arena.stats()["peak_in_use_bytes"] == 4096 + 16384 + 4096
    for slot in (small, full, extra):
        arena.free(slot)
    assert arena.stats()["in_use_bytes"] == 0 and arena.stats()["requested_in_use_bytes"] == 0


def test_threads_never_share_a_slot(make_arena):
    # Fewer slots than 4 threads can hold, so exhaustion and class spill-over happen under contention; and more than
    # one thread's share of the large class (up to 6 held, most sizes over 16 KiB), so that exhaustion happens even
    # when the scheduler runs the threads one after another (it did, on a loaded 2-core machine: no failed alloc).
    arena = make_arena({4 * KiB: 4, 16 * KiB: 4, 64 * KiB: 4})
    live, live_lock = set(), threading.Lock()

    def worker(seed):
        rng = random.Random(seed)
        held = []
        for _ in range(2000):
            if held and (len(held) >= 6 or rng.random() < 0.5):
                slot = held.pop(rng.randrange(len(held)))
                with live_lock:                           # leave the set before the slot can be handed out again
                    live.remove(slot.ptr)
                arena.free(slot)
            else:
                slot = arena.alloc(rng.randint(1, 64 * KiB))
                if slot is None:
                    continue
                with live_lock:
                    assert slot.ptr not in live, f"slot 0x{slot.ptr:x} handed out twice (seed {seed})"
                    live.add(slot.ptr)
                held.append(slot)
        for slot in held:
            with live_lock:
                live.remove(slot.ptr)
            arena.free(slot)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(worker, seed) for seed in range(4)]:
            future.result()                               # re-raises a worker's failure
    arena.validate()
    stats = arena.stats()
    assert stats["in_use_bytes"] == 0 and stats["allocs"] == stats["frees"] > 0
    assert stats["failed_allocs"] > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tensor_view_is_zero_copy(make_arena, dtype):
    arena = make_arena({8 * KiB: 2})
    numel = 1000
    slot = arena.alloc(numel * dtype.itemsize)
    writer = slot.as_tensor(dtype, numel)
    assert writer.dtype == dtype and writer.numel() == numel and writer.data_ptr() == slot.ptr
    writer.copy_(torch.arange(numel, dtype=dtype))
    reader = slot.as_tensor(dtype, numel)
    assert torch.equal(reader, torch.arange(numel, dtype=dtype))
    raw = slot.as_tensor(torch.uint8, slot.slot_bytes)
    raw[: dtype.itemsize].zero_()                         # write through one view, see it in the other
    assert reader[0].item() == 0 and writer[0].item() == 0
    with pytest.raises(ValueError):
        slot.as_tensor(dtype, slot.slot_bytes // dtype.itemsize + 1)


def test_tensor_view_keeps_the_arena_mapped(make_arena):
    def view_of_a_dropped_arena():
        arena = PinnedArena({4 * KiB: 1}, lock="off", register_with_cuda=False)
        tensor = arena.alloc(16).as_tensor(torch.float32, 4)
        tensor.fill_(7.0)
        return tensor                                     # arena and slot go out of scope here

    tensor = view_of_a_dropped_arena()
    gc.collect()
    assert tensor.tolist() == [7.0] * 4                   # would crash if __del__ had unmapped the region


def test_close_is_idempotent_and_blocks_later_use(make_arena):
    arena = make_arena({4 * KiB: 1})
    slot = arena.alloc(1)
    arena.close()
    arena.close()
    assert arena.closed
    with pytest.raises(ValueError, match="closed"):
        arena.alloc(1)
    with pytest.raises(ValueError, match="closed"):
        arena.free(slot)
    with PinnedArena({4 * KiB: 1}, lock="off") as scoped:
        assert scoped.alloc(1) is not None
    assert scoped.closed


def test_lock_off_locks_nothing(make_arena):
    arena = make_arena({4 * KiB: 2}, lock="off")
    assert arena.stats()["locked_bytes"] == 0 and arena.stats()["lock_fallbacks"] == 0
    assert arena.alloc(1).locked is False


def _has_cap_ipc_lock() -> bool:
    """CAP_IPC_LOCK (bit 14) lets a process lock memory beyond RLIMIT_MEMLOCK (root in most containers)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 14))
    return False


def test_lock_required_locks_every_region(make_arena):
    import resource
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft != resource.RLIM_INFINITY and soft < 1 * MiB and not _has_cap_ipc_lock():
        pytest.skip(f"memlock limit {soft} bytes is too small to lock even a small arena here")
    arena = make_arena({4 * KiB: 2, 8 * KiB: 1}, lock="required")
    stats = arena.stats()
    assert stats["locked_bytes"] == stats["reserved_bytes"] == 16 * KiB
    assert arena.alloc(1).locked is True


def _status_bytes(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def test_retired_slots_give_their_memory_back_and_restored_ones_take_it_again(make_arena):
    """Memory pressure (cache/tensor_store.py resize_cache): free slots leave the arena's use and their pages go
    back to the kernel, locked pages unlocked first; the process's locked and resident memory drop by them."""
    lock = "best_effort"
    arena = make_arena({8 * MiB: 4, 4 * KiB: 2}, lock=lock)
    locked = arena.stats()["locked_bytes"] == arena.stats()["reserved_bytes"]
    held = arena.alloc(8 * MiB)
    held.as_tensor(torch.uint8, 8 * MiB).fill_(7)
    size_class = held.size_class
    locked_before, resident_before = _status_bytes("VmLck"), _status_bytes("VmRSS")
    assert arena.retire(size_class, 10) == 3  # only the free ones
    assert arena.retired_slots(size_class) == 3 and arena.free_slots() == 2  # the two 4 KiB slots
    assert arena.alloc(8 * MiB) is None  # retired slots are not handed out (the 8 MiB class is full)
    assert _status_bytes("VmRSS") <= resident_before - 20 * MiB
    if locked:
        assert _status_bytes("VmLck") == locked_before - 24 * MiB
    stats = arena.stats()
    assert stats["retired_bytes"] == 24 * MiB and stats[f"class.{8 * MiB}.retired"] == 3
    assert stats["locked_bytes"] == (stats["reserved_bytes"] - 24 * MiB if locked else 0)
    assert torch.all(held.as_tensor(torch.uint8, 8 * MiB) == 7)  # a slot in use keeps its bytes
    arena.validate()

    assert arena.restore(size_class, 2) == 2
    again = [arena.alloc(8 * MiB) for _ in range(2)]
    assert all(slot is not None for slot in again) and arena.alloc(8 * MiB) is None
    if locked:
        assert _status_bytes("VmLck") == locked_before - 8 * MiB
    assert arena.restore(size_class, 5) == 1 and arena.stats()["retired_bytes"] == 0
    arena.validate()


def test_on_a_kernel_with_64_kib_pages_every_slot_is_whole_pages_and_retiring_one_spares_its_neighbours(
        make_arena, monkeypatch):
    """A 64 KiB-page kernel (arm64, e.g. Grace), forced through the page-size test hook. Slots were 4 KiB-aligned
    whatever the page: a slot then shared a page with its neighbour, and retiring it (munlock and madvise round out
    to whole pages) gave back the neighbour's first bytes, which read as zeros after. Now every slot is a whole
    number of pages, sizes equal after that rounding merged."""
    from tencache_ds.memory.arena import PAGE_ENV
    page = 64 * KiB
    monkeypatch.setenv(PAGE_ENV, str(page))
    arena = make_arena({5 * PAGE: 4, 8 * PAGE: 2, 20 * PAGE: 2})
    assert arena.classes == [(page, 6), (2 * page, 2)]
    slots = [arena.alloc(5 * PAGE) for _ in range(6)]
    # whole pages from the region's start (a real 64 KiB-page kernel maps the region at a page boundary; here it is
    # 4 KiB-aligned)
    base = min(slot.ptr for slot in slots)
    assert all(slot is not None and (slot.ptr - base) % page == 0 and slot.slot_bytes % page == 0 for slot in slots)
    for index, slot in enumerate(slots):  # every other slot keeps its bytes; the others are retired
        slot.as_tensor(torch.uint8, 5 * PAGE).fill_(index + 1)
    for slot in slots[::2]:
        arena.free(slot)
    assert arena.retire(slots[0].size_class, 3) == 3
    for index, slot in enumerate(slots):
        if index % 2:
            assert torch.all(slot.as_tensor(torch.uint8, 5 * PAGE) == index + 1), index
    arena.validate()
    monkeypatch.setenv(PAGE_ENV, "12288")  # not a power of two
    with pytest.raises(TencacheConfigError, match=PAGE_ENV):
        make_arena({PAGE: 1})
    monkeypatch.setenv(PAGE_ENV, "64k")  # not a number: named, not int()'s bare message
    with pytest.raises(TencacheConfigError, match=PAGE_ENV):
        make_arena({PAGE: 1})


def test_retiring_is_refused_where_cuda_registered_the_pages(make_arena):
    arena = make_arena({4 * KiB: 2})
    arena._registered = [(0, 1)]  # what register_regions leaves when CUDA accepted a region (no GPU here)
    try:
        assert not arena.can_retire and arena.retire(0, 2) == 0 and arena.free_slots() == 2
    finally:
        arena._registered = []


# The child lowers RLIMIT_MEMLOCK to 64 KiB and asks for a 1 MiB region. As root, CAP_IPC_LOCK would ignore
# the limit, so the child drops that capability first (capset through ctypes).
_MEMLOCK_CHILD = textwrap.dedent("""
    import ctypes, json, resource, sys, warnings

    class CapHeader(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class CapData(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = CapHeader(0x20080522, 0), (CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0:
        print(json.dumps({"skip": "capget failed"})); sys.exit(0)
    if data[0].effective & (1 << 14):                          # CAP_IPC_LOCK
        data[0].effective &= ~(1 << 14)
        if libc.capset(ctypes.byref(header), data) != 0:
            print(json.dumps({"skip": "cannot drop CAP_IPC_LOCK"})); sys.exit(0)
    _soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, hard))

    from tencache_ds.errors import TencacheResourceError
    from tencache_ds.memory import PinnedArena
    result = {}
    try:
        PinnedArena({1 << 20: 1}, lock="required", register_with_cuda=False).close()
        result["required"] = None
    except TencacheResourceError as exc:
        result["required"] = str(exc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arena = PinnedArena({1 << 20: 1}, lock="best_effort", register_with_cuda=False)
    result["warnings"] = [str(w.message) for w in caught]
    result["stats"] = arena.stats()
    slot = arena.alloc(10)
    result["slot_locked"] = slot.locked
    arena.free(slot)
    arena.validate()
    arena.close()
    print(json.dumps(result))
""")


def test_memlock_limit_required_raises_and_best_effort_warns(make_arena):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _MEMLOCK_CHILD], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    message = result["required"]
    assert message is not None, "lock='required' did not raise under a 64 KiB memlock limit"
    assert "memlock" in message.lower() and "ulimit -l unlimited" in message and "memlock=-1" in message
    assert "1048576 bytes" in message and "64.00 KiB" in message and "best_effort" in message
    assert len(result["warnings"]) == 1 and "ulimit" in result["warnings"][0]
    assert result["stats"]["lock_fallbacks"] >= 1 and result["stats"]["locked_bytes"] == 0
    assert result["slot_locked"] is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_regions_are_registered_with_cuda(make_arena):
    arena = make_arena({64 * KiB: 2}, lock="best_effort", register_with_cuda=True)
    assert arena.stats()["registered_bytes"] == arena.stats()["reserved_bytes"]
    host = arena.alloc(4096).as_tensor(torch.float32, 1024)
    assert host.is_pinned()
    host.copy_(torch.arange(1024, dtype=torch.float32))
    device = host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(device.cpu(), host)


# -- the C test driver --------------------------------------------------------------------------------

_C_FLAGS = {"plain": ["-O2"], "sanitizers": ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]}


@pytest.mark.parametrize("build", sorted(_C_FLAGS))
def test_c_driver(tmp_path, build):
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    binary = tmp_path / "test_arena"
    compile_cmd = [compiler, "-std=c11", "-Wall", "-Wextra", *_C_FLAGS[build], "-I", "csrc/include",
                   "csrc/arena.c", "csrc/tests/test_arena.c", "-lpthread", "-o", str(binary)]
    compiled = subprocess.run(compile_cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if compiled.returncode != 0 and build == "sanitizers":
        pytest.skip(f"compiler cannot build with sanitizers: {compiled.stderr.strip()[-300:]}")
    assert compiled.returncode == 0, compiled.stderr
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="halt_on_error=1")
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, env=env)
    if build == "sanitizers" and "LeakSanitizer has encountered a fatal error" in run.stderr:
        pytest.skip("LeakSanitizer cannot run here (ptrace restricted)")
    summary = re.search(r"^(\d+) passed, (\d+) failed$", run.stdout, re.MULTILINE)
    assert summary, run.stdout + run.stderr
    assert int(summary.group(2)) == 0 and int(summary.group(1)) > 0, run.stdout
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_pools_close_waits_for_the_device_copies_still_reading_its_released_slots():
    """Regression test (helper-159's review): a slot released with a fence (DeepSpeed's non-blocking copy to the
    device may still read it) and the pool closed before the slot was taken again: the fence was dropped unwaited and
    the memory unmapped under the copy. The close waits for it first."""
    from tencache_ds.memory.pool import BufferPool

    class Fence:
        waited = False

        def synchronize(self):
            self.waited = True

    pool = BufferPool("params", lock="off")
    pool.add_classes({4096: 2})
    buffer = pool.acquire(4096)
    buffer.fence = fence = Fence()
    pool.release(buffer)
    assert not fence.waited
    pool.close()
    assert fence.waited

    class FailingFence:  # a sticky device error: the arenas are unmapped all the same, then it is raised
        def synchronize(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    pool.add_classes({4096: 1})
    buffer = pool.acquire(4096)
    buffer.fence = FailingFence()
    pool.release(buffer)
    arenas = list(pool._arenas)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        pool.close()
    assert arenas and all(arena.closed for arena in arenas)


def test_an_interrupt_in_the_wait_for_a_released_slots_fence_gives_the_slot_back():
    """Regression test (helper-211's review): taking a slot released with a fence waits for that fence outside the
    pool's lock, the slot already handed out; a Ctrl-C (or a device error) there lost the slot for good: no caller
    got it, the class one slot short, its bytes counted in use. It goes back, its fence still owed."""
    from tencache_ds.memory.pool import BufferPool

    class Fence:
        waits = 0

        def synchronize(self):
            self.waits += 1
            if self.waits == 1:
                raise KeyboardInterrupt

    pool = BufferPool("params", lock="off")
    pool.add_classes({4096: 1})
    buffer = pool.acquire(4096)
    buffer.fence = fence = Fence()
    pool.release(buffer)
    with pytest.raises(KeyboardInterrupt):
        pool.try_acquire(4096)
    assert pool.stats()["in_use_bytes"] == 0
    again = pool.try_acquire(4096)  # the one slot, its fence waited for this time
    assert again is not None and fence.waits == 2
    pool.release(again)
    pool.close()


def test_a_request_for_its_own_class_only_leaves_the_larger_classes_peaks_alone():
    """Regression test (helper-159's review): with its own class full, the request took a larger class's slot and gave
    it back at once, which counted in the arena's peak in use (the reported pinned peak) and the class's peak."""
    from tencache_ds.memory.pool import BufferPool
    pool = BufferPool("params", lock="off")
    pool.add_classes({4096: 1, 1 << 20: 1})
    first = pool.try_acquire(4096, own_class_only=True)
    assert first is not None and pool.try_acquire(4096, own_class_only=True) is None
    assert pool.stats()["peak_in_use_bytes"] == 4096
    pool.release(first)
    pool.close()


def test_a_pageable_buffer_is_not_shared_with_a_forked_child_so_giving_it_back_frees_it():
    """Regression test (helper-197): the pool's pageable buffers (kept optimizer state, fallbacks) were shared
    anonymous mappings, inherited by every fork()ed child (DataLoader workers): the parent's release freed nothing
    while one lived. They are MADV_DONTFORK, as the arena's regions are: the child has no such mapping."""
    from tencache_ds.memory.pool import BufferPool
    pool = BufferPool("optimizer", lock="off")
    buffer = pool.acquire_pageable(1 << 20, count_as_fallback=False)
    start = buffer.ptr
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: is the buffer's address mapped here?
        os.close(read)
        with open("/proc/self/maps") as maps:
            mapped = any(int(low, 16) <= start < int(high, 16)
                         for low, high in (line.split()[0].split("-") for line in maps))
        os.write(write, b"1" if mapped else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(child, 0)
    pool.release(buffer)
    pool.close()
    assert answer == b"0", "a fork()ed child shares the pool's pageable buffer"


def test_an_interruption_as_the_arena_is_made_leaves_nothing_mapped_or_locked(make_arena, monkeypatch):
    """Regression test (helper-224's review): a Ctrl-C raised as ``tc_arena_create`` returned (it maps and locks
    every region: a second for 2 GiB) left the arena unreachable, its regions mapped and locked until the process
    ended (a notebook's next start-up met the memlock limit). The interrupted constructor's arena is unmapped."""
    from tencache_ds.memory import _native
    make_arena({4 * KiB: 1})  # the library loaded (or the test skipped/failed as the others do)
    real = _native.lib()

    class InterruptedAsCreateReturns:
        def __getattr__(self, name):
            return getattr(real, name)

        def tc_arena_create(self, *args):
            real.tc_arena_create(*args)
            raise KeyboardInterrupt

    monkeypatch.setattr(_native, "lib", lambda: InterruptedAsCreateReturns())
    locked = _status_bytes("VmLck")
    with pytest.raises(KeyboardInterrupt):
        PinnedArena({8 * MiB: 2}, lock="best_effort")
    gc.collect()
    assert _status_bytes("VmLck") == locked  # (16 MiB more without: locked where this test runs, as root)


def test_a_reservation_larger_than_memory_maps_and_commits_nothing(make_arena):
    """helper-235: the optimizer's eight streaming slots of DeepSpeed's default 1e9-element sub-group are 32 GB of
    addresses, most never touched; the kernel's overcommit heuristic refused the region on a machine with less
    RAM and swap, and the run stopped at start-up. Mapped MAP_NORESERVE, it is committed slot by slot."""
    with open("/proc/sys/vm/overcommit_memory") as handle:
        if handle.read().strip() != "0":
            pytest.skip("the heuristic overcommit mode (0) is where the flag matters; 2 ignores it, 1 needs none")
    with open("/proc/meminfo") as handle:
        meminfo = {line.split(":")[0]: int(line.split()[1]) * KiB for line in handle}
    slot = 1 << 30
    count = 2 * (meminfo["MemTotal"] + meminfo["SwapTotal"]) // slot + 1
    before = _committed_bytes()
    arena = make_arena({slot: count})
    assert arena.stats()["reserved_bytes"] == slot * count
    assert _committed_bytes() - before < 64 * MiB  # (the other processes' too: a margin, not the region)
    taken = arena.alloc(slot)
    ctypes.memset(taken.ptr, 1, PAGE)  # a slot in use is memory like any other
    arena.free(taken)


def _committed_bytes() -> int:
    with open("/proc/meminfo") as handle:
        return next(int(line.split()[1]) * KiB for line in handle if line.startswith("Committed_AS:"))
