"""io/drive_rate.py on real files: the trials it runs through tencache's engine, the rates it keeps, and the least
time those rates give for a step's reads and writes."""
import math
import os
import time

import pytest

from tencache_ds.io.drive_rate import (ARENA_BUFFERS, BOTH, READ, TORCH_BUFFERS, WRITE, DriveRate, Trial, measure_drive,
                                      store_thread_counts, trial_buffers)

MIB = 1 << 20
GB = 1e9


def test_measure_drive_times_reads_writes_and_both_with_real_files(tmp_path):
    """Scenario: a small measurement (2 request sizes x 2 thread counts) in a real folder."""
    # Step 1: measure with 8 MiB per trial.
    rate = measure_drive(str(tmp_path / "drive"), request_sizes=(1 * MIB, 4 * MIB), thread_counts=(1, 2),
                         trial_bytes=8 * MIB, deadline_s=math.inf)  # no cut: exact byte counts
    # Step 2: every combination wrote the file twice (new, then overwritten: the stores overwrite theirs), read it
    # and ran a mixed trial, each moving the bytes asked for.
    assert [(trial.mode, trial.request_bytes, trial.threads) for trial in rate.trials] == [
        (mode, size, threads) for size in (MIB, 4 * MIB) for threads in (1, 2)
        for mode in (WRITE, WRITE, READ, BOTH)]
    for trial in rate.trials:
        expected = {WRITE: (0, 8 * MIB), READ: (8 * MIB, 0), BOTH: (8 * MIB, 8 * MIB)}[trial.mode]
        assert (trial.read_bytes, trial.write_bytes) == expected, trial
    # Step 3: the rates kept are the fastest trial's of each kind.
    assert rate.read_bytes_per_s == max(trial.read_bytes_per_s for trial in rate.trials if trial.mode == READ)
    assert rate.write_bytes_per_s == max(trial.write_bytes_per_s for trial in rate.trials if trial.mode == WRITE)
    both = max((trial for trial in rate.trials if trial.mode == BOTH), key=lambda trial: trial.bytes_per_s)
    assert rate.combined_bytes_per_s >= both.bytes_per_s > 0
    assert "tencache DirectFileIO" in rate.method and "both at once" in rate.describe()
    # Step 4: repeats run every combination again, and the rates are the fastest over all of them.
    twice = measure_drive(str(tmp_path / "drive"), request_sizes=(MIB,), thread_counts=(2,), trial_bytes=2 * MIB,
                          deadline_s=math.inf, repeats=2)
    assert [trial.mode for trial in twice.trials] == [WRITE, WRITE, READ, BOTH] * 2
    assert twice.write_bytes_per_s == max(trial.write_bytes_per_s for trial in twice.trials if trial.mode == WRITE)
    # Step 5: no file is left behind, and the record survives JSON (the probe sends it to the parent).
    assert os.listdir(tmp_path / "drive") == []
    assert DriveRate.from_dict(rate.to_dict()) == rate


def test_trials_move_bytes_into_the_stores_arena_slots_and_torch_buffers_only_where_asked(tmp_path):
    """O_DIRECT pins each page of a request's buffer, so the buffers' pages set the rate (io/drive_rate.py): the
    rates come from trials into arena slots, as the stores move bytes, and torch.empty buffers (DeepSpeed's) are
    timed beside them at the sizes asked for, in the same repeat, without entering the rates."""
    rate = measure_drive(str(tmp_path / "drive"), request_sizes=(MIB, 4 * MIB), thread_counts=(2,),
                         trial_bytes=8 * MIB, deadline_s=math.inf, repeats=2, torch_buffer_sizes=(4 * MIB,))
    assert [(trial.request_bytes, trial.buffers) for trial in rate.trials[::4]] == [
        (MIB, ARENA_BUFFERS), (4 * MIB, ARENA_BUFFERS), (4 * MIB, TORCH_BUFFERS)] * 2
    arena_reads = [trial.read_bytes_per_s for trial in rate.trials if trial.mode == READ
                   and trial.buffers == ARENA_BUFFERS]
    assert rate.read_bytes_per_s == max(arena_reads)
    assert rate.at_request_size(4 * MIB, TORCH_BUFFERS).read_bytes_per_s == max(
        trial.read_bytes_per_s for trial in rate.trials if trial.mode == READ and trial.buffers == TORCH_BUFFERS)
    assert "into arena slots" in rate.method
    # a record of the time before the buffers were named: its trials moved bytes into torch.empty buffers
    old = rate.to_dict()
    for trial in old["trials"]:
        del trial["buffers"]
    assert {trial.buffers for trial in DriveRate.from_dict(old).trials} == {TORCH_BUFFERS}


def _vm_flags(address: int) -> set:
    """The kernel's VmFlags of the mapping holding ``address`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                start, end = (int(bound, 16) for bound in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_arena_trial_buffers_are_huge_page_memory_and_torch_ones_are_not():
    """The stores' slots are advised for huge pages (csrc/arena.c: MADV_HUGEPAGE, the ``hg`` flag), which is what
    made their O_DIRECT requests 1.7-2.3x as fast here as torch.empty memory's; trial_buffers hands out each kind."""
    if not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        pytest.skip("a kernel without transparent huge pages: no mapping is advised for them")
    with trial_buffers(ARENA_BUFFERS, 4 * MIB, 2) as arena, trial_buffers(TORCH_BUFFERS, 4 * MIB, 2) as torch_:
        assert [int(buffer[0]) for buffer in arena] == [1, 2] and [int(buffer[-1]) for buffer in torch_] == [1, 2]
        assert all("hg" in _vm_flags(buffer.data_ptr()) for buffer in arena)
        if not os.environ.get("THP_MEM_ALLOC_ENABLE"):  # (which makes torch advise its large allocations too)
            assert not any("hg" in _vm_flags(buffer.data_ptr()) for buffer in torch_)
    with pytest.raises(ValueError, match="not 'arena' or 'torch.empty'"):
        with trial_buffers("pinned", MIB, 1):
            pass


def test_a_deadline_ends_a_trial_early_and_the_rate_counts_what_was_moved(tmp_path):
    """Scenario: a deadline of 0 s: each trial issues its first requests only, yet the rates stay honest."""
    rate = measure_drive(str(tmp_path), request_sizes=(1 * MIB,), thread_counts=(2,), trial_bytes=64 * MIB,
                         deadline_s=0.0)
    new_file, overwrite, read, _both = rate.trials
    assert new_file.write_bytes == overwrite.write_bytes == 2 * MIB  # cut short after one request per thread
    assert read.read_bytes == overwrite.write_bytes  # reads only what was written
    assert rate.write_bytes_per_s == pytest.approx(max(trial.write_bytes / trial.seconds
                                                       for trial in (new_file, overwrite)))


def test_least_seconds_takes_the_slowest_of_reads_writes_and_all_bytes():
    """The least time for a step's bytes: reads alone, writes alone, or everything at the combined rate."""
    mixed = Trial(BOTH, MIB, 4, read_bytes=1 * 10 ** 9, write_bytes=1 * 10 ** 9, seconds=0.8,
                  buffers=ARENA_BUFFERS)  # 2.5 GB/s together
    rate = DriveRate(2 * GB, 1.5 * GB, 1.25 * GB, 1.25 * GB, "test", (mixed,))
    assert rate.combined_bytes_per_s == pytest.approx(2.5 * GB)
    assert rate.least_seconds(2 * GB, 1 * GB) == pytest.approx(1.2)   # all 3 GB at 2.5 GB/s
    assert rate.least_seconds(4 * GB, 0) == pytest.approx(2.0)        # reads alone at 2 GB/s
    assert rate.least_seconds(0, 3 * GB) == pytest.approx(2.0)        # writes alone at 1.5 GB/s
    # A mixed trial faster in one direction than that direction alone raises that direction's rate.
    skewed = DriveRate(1 * GB, 1 * GB, 1.8 * GB, 0.2 * GB, "test")
    assert skewed.least_seconds(1.8 * GB, 0) == pytest.approx(1.0)


def test_requests_in_flight_follow_the_swappers_engines():
    """Each store's engine has max(2, aio.intra_op_parallelism) threads; both stores at once twice that."""
    assert store_thread_counts() == (2, 4) == store_thread_counts({"aio": {"intra_op_parallelism": 1}})
    assert store_thread_counts({"aio": {"intra_op_parallelism": 4}}) == (4, 8)
    assert store_thread_counts({"aio": {"intra_op_parallelism": 4.0}}) == (4, 8)  # JSON's 4.0: the swappers' 4
    assert store_thread_counts({"zero_optimization": {}}) == (2, 4)


def test_writes_through_o_direct_are_timed_without_an_fsync_and_buffered_ones_with_it(tmp_path, monkeypatch):
    """The stores never flush between steps, and an fsync after O_DIRECT writes only empties the drive's cache (it
    halved the write rate timed on this VM's virtual disk); bytes that went through the page cache are not written
    until flushed, so there the flush is part of the write."""
    from tencache_ds.io import drive_rate
    from tencache_ds.io.direct_io import DirectFileIO
    flushed = []
    monkeypatch.setattr(drive_rate, "_fsync", flushed.append)
    # Step 1: this folder takes O_DIRECT (ext4 here): no trial flushes.
    measure_drive(str(tmp_path / "direct"), request_sizes=(MIB,), thread_counts=(2,), trial_bytes=4 * MIB,
                  deadline_s=math.inf)
    assert DirectFileIO().alignment_for(str(tmp_path / "direct" / "f")) > 0
    assert flushed == []
    # Step 2: a folder where the engine falls back to buffered writes (alignment 0: a file system without O_DIRECT,
    # which this machine's do not lack, so the engine is told so): every write trial flushes what it wrote.
    monkeypatch.setattr(DirectFileIO, "alignment_for", lambda self, path: 0)
    rate = measure_drive(str(tmp_path / "buffered"), request_sizes=(MIB,), thread_counts=(2,), trial_bytes=4 * MIB,
                         deadline_s=math.inf)
    writes = [trial for trial in rate.trials if trial.mode in (WRITE, BOTH)]
    assert len(writes) == 3  # the new file, its overwrite, the mixed trial
    assert len(flushed) == 4  # and the untimed first write of the file the mixed trial overwrites
    assert all(os.path.basename(path).startswith(".tencache-drive-") for path in flushed)


def test_buffered_reads_are_timed_from_the_drive_not_the_page_cache(tmp_path, monkeypatch):
    """Regression (helper-187's review): where the engine falls back to buffered I/O, the read trials read the file
    the write trials had just left in the page cache: the "drive's" read rate was a memory copy's. The written files'
    pages are dropped after their flush, so the reads come from the drive (this process's storage reads, in
    /proc/self/io, cover them)."""
    from tencache_ds.io.direct_io import DirectFileIO

    def storage_read_bytes():
        with open("/proc/self/io") as io:
            return next(int(line.split()[1]) for line in io if line.startswith("read_bytes:"))
    monkeypatch.setattr(DirectFileIO, "alignment_for", lambda self, path: 0)
    before = storage_read_bytes()
    rate = measure_drive(str(tmp_path), request_sizes=(MIB,), thread_counts=(2,), trial_bytes=8 * MIB,
                         deadline_s=math.inf)
    read = sum(trial.read_bytes for trial in rate.trials if trial.mode in (READ, BOTH))
    assert read >= 8 * MIB
    assert storage_read_bytes() - before >= read, (storage_read_bytes() - before, read)


def test_a_measurement_removes_the_files_a_killed_one_left_and_no_living_ones(tmp_path):
    """A calibration stopped by its timeout cannot remove its trial files (up to 2 GiB): the next measurement in that
    folder does, and leaves those of a measurement still running, and other files, alone."""
    import subprocess
    import sys
    from tencache_ds.io.drive_rate import TRIAL_FILE_PREFIX, remove_stale_trial_files
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(ended.stdout)
    left = [tmp_path / f"{TRIAL_FILE_PREFIX}{dead_pid}-{name}.bin" for name in "ab"]
    running = tmp_path / f"{TRIAL_FILE_PREFIX}{os.getppid()}-a.bin"  # this test's parent: alive
    other = tmp_path / "optimizer.swp"
    for path in left + [running, other]:
        path.write_bytes(b"x" * 4096)
    measure_drive(str(tmp_path), request_sizes=(MIB,), thread_counts=(2,), trial_bytes=2 * MIB, deadline_s=math.inf)
    assert not any(path.exists() for path in left)
    assert running.exists() and other.exists()
    assert remove_stale_trial_files(str(tmp_path)) == []


def test_trial_files_name_their_host_and_another_hosts_are_left_while_written(tmp_path):
    """A folder shared between nodes: another node's live measurement, whose pid means nothing here, keeps its files;
    one of its files that nothing has written for an hour is removed; this host's are judged by their process, in
    the names measurements give them now and in the older names without a host."""
    import socket
    import subprocess
    import sys
    from tencache_ds.io.drive_rate import TRIAL_FILE_PREFIX, remove_stale_trial_files, trial_file
    from tencache_ds.io.stale_files import UNTOUCHED_ELSEWHERE_S
    here = socket.gethostname()
    assert trial_file(str(tmp_path), "a") == str(tmp_path / f"{TRIAL_FILE_PREFIX}{os.getpid()}-a@{here}.bin")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(ended.stdout)
    elsewhere_live = tmp_path / f"{TRIAL_FILE_PREFIX}{dead_pid}-a@other-node.cluster.bin"
    elsewhere_left = tmp_path / f"{TRIAL_FILE_PREFIX}{dead_pid}-b@other-node.cluster.bin"
    here_dead = [tmp_path / f"{TRIAL_FILE_PREFIX}{dead_pid}-contention@{here}.bin",
                 tmp_path / f"{TRIAL_FILE_PREFIX}{dead_pid}-b.bin"]
    here_live = tmp_path / f"{TRIAL_FILE_PREFIX}{os.getppid()}-a@{here}.bin"
    not_trials = [tmp_path / f"{TRIAL_FILE_PREFIX}{dead_pid}-a@x@y.bin", tmp_path / f"{TRIAL_FILE_PREFIX}x-a.bin"]
    for path in [elsewhere_live, elsewhere_left, here_live] + here_dead + not_trials:
        path.write_bytes(b"x" * 4096)
    long_ago = time.time() - UNTOUCHED_ELSEWHERE_S - 60
    os.utime(elsewhere_left, (long_ago, long_ago))
    removed = remove_stale_trial_files(str(tmp_path))
    assert sorted(removed) == sorted(map(str, here_dead + [elsewhere_left]))
    assert elsewhere_live.exists() and here_live.exists() and all(path.exists() for path in not_trials)


def test_the_rates_at_one_request_size_come_from_that_sizes_trials_only():
    """`--machine this` keeps the rates at 64 MiB as its figures and the other sizes' as factors
    (cli/calibrate.py measure_nvme): each size's rates are its own fastest trials, and a size that moved nothing is
    an error, not a zero factor."""
    small, large, arena, torch_ = 4 << 20, 512 << 20, ARENA_BUFFERS, TORCH_BUFFERS
    trials = (Trial(READ, small, 2, 100, 0, 1.0, arena), Trial(READ, small, 2, 300, 0, 1.0, arena),
              Trial(READ, large, 2, 900, 0, 1.0, arena), Trial(WRITE, small, 2, 0, 200, 1.0, arena),
              Trial(WRITE, large, 2, 0, 800, 1.0, arena), Trial(BOTH, small, 2, 50, 50, 1.0, arena),
              Trial(BOTH, large, 2, 400, 400, 1.0, arena),
              # the same size into torch.empty buffers: faster here, so that taking them would show
              Trial(READ, small, 2, 700, 0, 1.0, torch_), Trial(WRITE, small, 2, 0, 600, 1.0, torch_),
              Trial(BOTH, small, 2, 250, 250, 1.0, torch_))
    rate = DriveRate(900, 800, 400, 400, "test", trials)
    at_small = rate.at_request_size(small)
    assert (at_small.read_bytes_per_s, at_small.write_bytes_per_s, at_small.combined_bytes_per_s) == (300, 200, 300)
    into_torch = rate.at_request_size(small, torch_)
    assert (into_torch.read_bytes_per_s, into_torch.write_bytes_per_s, into_torch.combined_bytes_per_s) == (700, 600,
                                                                                                           700)
    assert rate.at_request_size(large).read_bytes_per_s == 900
    with pytest.raises(OSError, match="moved no bytes"):
        rate.at_request_size(64 << 20)
    with pytest.raises(OSError, match="moved no bytes"):
        rate.at_request_size(large, torch_)
