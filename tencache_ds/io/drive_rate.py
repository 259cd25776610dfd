"""How fast the NVMe path moves bytes the way tencache moves them. Owns: timing reads, writes, and both at once
through tencache's own engine (io/direct_io.py: O_DIRECT, a thread pool, one future per request) at the request
sizes and concurrency the stores issue, and the fastest rates seen (DriveRate). Does not own: the engine itself,
or what the rates are used for (the bench's bound, `tencache-ds doctor`'s line).

Why not DeepSpeed's aio handle with one synchronous request at a time (`doctor`'s "nvme bandwidth" line): tencache
never moves bytes that way. Each store (parameters, optimizer state) has its own engine of
``max(2, aio.intra_op_parallelism)`` threads, so up to two requests per store, four in all, are in flight; a request
is one tensor (a parameter partition: a few MB; an optimizer sub-group's tensor: tens to hundreds of MB); and
reads and writes overlap (an update writes sub-group i while reading i + 1). So each trial here keeps ``threads``
requests of ``request_bytes`` in flight, for each of reads, writes and an even mix of both, and the rates kept
are the fastest trial's: the bound these rates feed must not be above what tencache can get from the drive.

The buffers are the kind most of the stores' bytes move through: slots of the native arena (``ARENA_BUFFERS``: huge
pages, page-locked where the limit allows; the parameter store's buffers and the optimizer store's streaming ones).
O_DIRECT pins every page of a request's buffer, so the pages' size sets the rate as much as the drive does: on this
VM (2026-12-06) 64 MiB requests into torch.empty buffers (4 KiB pages: DeepSpeed's swap buffers) read at 1.9-2.7
GB/s and wrote at 1.5-2.6, into arena slots at 4.1-4.5 and 2.9-3.5; tencache's training steps had moved their bytes
at 2.8-3.4 GB/s of busy drive (metrics' ``nvme_busy_fraction``, run 27) where trials into torch.empty buffers had
measured 1.6-1.7. Until then every trial used torch.empty buffers. The optimizer store's kept entries are shared
mappings of 4 KiB pages (memory/pool.py) and move at about the torch.empty rate; the step model does not tell them
apart (their bytes move when first read and when evicted, not every step). ``torch_buffer_sizes`` times those sizes
into torch.empty buffers as well (``TORCH_BUFFERS``), in the same repeats, for a model of DeepSpeed's own swapping.

A trial moves at most ``trial_bytes`` and stops issuing at ``deadline_s`` (a slow disk ends early rather than
late), so the whole measurement takes a few seconds. The files live in the folder measured and are removed.
"""
import contextlib
import dataclasses
import os
import re
import socket
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .direct_io import store_io_threads
from .stale_files import pid_in_name, remove_files_of_dead_processes

READ, WRITE, BOTH = "read", "write", "read+write"
ARENA_BUFFERS, TORCH_BUFFERS = "arena", "torch.empty"  # the buffers a trial moves bytes into (module docstring)
PARTITION_REQUEST_BYTES = 4 << 20   # a parameter partition
TENSOR_REQUEST_BYTES = 64 << 20     # an optimizer sub-group's tensor (sub_group_size 1.6e7), or a large partition
REQUEST_SIZES = (PARTITION_REQUEST_BYTES, TENSOR_REQUEST_BYTES)
TRIAL_BYTES = 256 << 20              # per trial and direction: past a drive's write cache, < 0.2 s at 2 GB/s
DEADLINE_S = 1.0                     # per trial: no new request is issued after it
TRIAL_FILE_PREFIX = ".tencache-drive-"  # then the measuring process's pid, the file's kind and its host (trial_file)
# <prefix><pid>-<kind>@<host>.bin; without "@<host>": the name measurements gave their files before 2026-12-02
_TRIAL_FILE = re.compile(re.escape(TRIAL_FILE_PREFIX) + r"(?P<pid>[0-9]+)-(?P<kind>[a-z]+)(?:@(?P<host>[^@/]+))?\.bin")
# Test hook: the suite's tests of `doctor`, `bench` and `estimate --machine this` check what each measures and reports,
# not the drive's rate, whose trials take most of their time (8 of doctor's 16 s here, a minute of a calibration). Set
# to anything but "" or "0" (read only in quick_drive), the drive is timed in one repeat, no trial issuing a request
# after QUICK_DEADLINE_S (each still moves one request per buffer: a whole round); the rate's method says so.
QUICK_ENV = "TENCACHE_QUICK_DRIVE"
QUICK_DEADLINE_S = 0.25


def store_thread_counts(ds_config: Optional[Dict[str, Any]] = None) -> Tuple[int, int]:
    """The requests in flight when one store's engine is busy, and when both are: the swappers'
    ``DirectFileIO(num_threads=store_io_threads(intra_op))``, ``intra_op`` being the DeepSpeed config's
    aio.intra_op_parallelism (DeepSpeed's default 1 without a config)."""
    aio = (ds_config or {}).get("aio") or {}
    intra_op = aio.get("intra_op_parallelism", 1) if isinstance(aio, dict) else 1
    # a whole number written as a float (JSON 4.0) is that number, as the swappers' int() reads it
    whole = not isinstance(intra_op, bool) and isinstance(intra_op, (int, float)) and float(intra_op).is_integer()
    one = store_io_threads(int(intra_op) if whole and intra_op >= 1 else 1)
    return one, 2 * one


THREAD_COUNTS = store_thread_counts()  # (2, 4) for DeepSpeed's default aio config


def quick_drive() -> bool:
    """Whether the test hook QUICK_ENV shortens measure_drive in this process (every call: a test sets it for the
    process it starts, not for a whole session, whose tests of measure_drive ask for their own repeats)."""
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def repeats_made(repeats: int) -> int:
    """The repeats measure_drive makes when asked for ``repeats``: one under the test hook."""
    return 1 if quick_drive() else repeats


@dataclasses.dataclass(frozen=True)
class Trial:
    """One timed run: ``threads`` requests of ``request_bytes`` in flight, reading, writing or both."""

    mode: str
    request_bytes: int
    threads: int
    read_bytes: int
    write_bytes: int
    seconds: float
    buffers: str  # what the bytes moved into: ARENA_BUFFERS or TORCH_BUFFERS

    @property
    def read_bytes_per_s(self) -> float:
        return self.read_bytes / self.seconds

    @property
    def write_bytes_per_s(self) -> float:
        return self.write_bytes / self.seconds

    @property
    def bytes_per_s(self) -> float:
        return (self.read_bytes + self.write_bytes) / self.seconds


@dataclasses.dataclass(frozen=True)
class DriveRate:
    """The fastest rates of a folder's drive over the trials, in bytes per second: reading alone, writing alone,
    and reading and writing at once (``both_*``: each direction's share of the fastest mixed trial)."""

    read_bytes_per_s: float
    write_bytes_per_s: float
    both_read_bytes_per_s: float
    both_write_bytes_per_s: float
    method: str
    trials: Tuple[Trial, ...] = ()

    @property
    def combined_bytes_per_s(self) -> float:
        """The most bytes per second the drive moved in any trial, reads and writes together."""
        return max(self.read_bytes_per_s, self.write_bytes_per_s,
                   self.both_read_bytes_per_s + self.both_write_bytes_per_s)

    def least_seconds(self, read_bytes: float, write_bytes: float) -> float:
        """The least time these rates need for ``read_bytes`` and ``write_bytes``: no faster than reads alone, writes
        alone, or all the bytes at the combined rate. E.g. 2 GB read and 1 GB written at read 2 GB/s, write 1.5
        GB/s, combined 2.5 GB/s: max(1.0, 0.67, 1.2) = 1.2 s."""
        read_rate = max(self.read_bytes_per_s, self.both_read_bytes_per_s)
        write_rate = max(self.write_bytes_per_s, self.both_write_bytes_per_s)
        return max(read_bytes / read_rate, write_bytes / write_rate,
                   (read_bytes + write_bytes) / self.combined_bytes_per_s)

    def at_request_size(self, request_bytes: int, buffers: str = ARENA_BUFFERS) -> "DriveRate":
        """The same measurement's rates from its trials of ``request_bytes`` requests into ``buffers`` only. Raises
        OSError when those moved no bytes in some mode."""
        return _fastest([trial for trial in self.trials
                         if trial.request_bytes == request_bytes and trial.buffers == buffers],
                        f"{self.method}; requests of {_mib(request_bytes)} into {buffers} buffers only")

    def describe(self) -> str:
        return (f"read {self.read_bytes_per_s / 1e9:.2f} GB/s, write {self.write_bytes_per_s / 1e9:.2f} GB/s, both at "
                f"once {self.combined_bytes_per_s / 1e9:.2f} GB/s")

    def to_dict(self) -> Dict[str, Any]:
        return dict(dataclasses.asdict(self), combined_bytes_per_s=self.combined_bytes_per_s)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "DriveRate":
        # records made before 2026-12-06 name no buffers: their trials moved bytes into torch.empty ones
        trials = tuple(Trial(**{"buffers": TORCH_BUFFERS, **trial}) for trial in data.get("trials") or ())
        return cls(float(data["read_bytes_per_s"]), float(data["write_bytes_per_s"]),
                   float(data["both_read_bytes_per_s"]), float(data["both_write_bytes_per_s"]), str(data["method"]),
                   trials)


def measure_drive(folder: str, request_sizes: Sequence[int] = REQUEST_SIZES,
                  thread_counts: Sequence[int] = THREAD_COUNTS, trial_bytes: int = TRIAL_BYTES,
                  deadline_s: float = DEADLINE_S, repeats: int = 1,
                  torch_buffer_sizes: Sequence[int] = ()) -> DriveRate:
    """Time writes, reads and both at once in ``folder`` (created if missing) for every request size and thread
    count, ``repeats`` times over, into arena slots, and for the sizes in ``torch_buffer_sizes`` into torch.empty
    buffers too (the module docstring says why); the fastest trial of each mode into arena slots gives the rates
    (the test hook QUICK_ENV: one repeat, no request issued after QUICK_DEADLINE_S). Raises OSError when the folder
    cannot be written, TencacheResourceError without the native arena library (which training needs too)."""
    from .direct_io import DirectFileIO
    quick = quick_drive()
    repeats, deadline_s = repeats_made(repeats), min(deadline_s, QUICK_DEADLINE_S) if quick else deadline_s
    os.makedirs(folder, exist_ok=True)
    remove_stale_trial_files(folder)
    trials: List[Trial] = []
    alignment = None
    timed = [(size, buffers) for size in request_sizes
             for buffers in (ARENA_BUFFERS, TORCH_BUFFERS)[:2 if size in torch_buffer_sizes else 1]]
    for request_bytes, buffers_kind in [each for _repeat in range(repeats) for each in timed]:
        for threads in thread_counts:
            requests = max(threads, trial_bytes // request_bytes)  # every thread busy, whatever the request size
            first, second = (trial_file(folder, name) for name in "ab")
            with trial_buffers(buffers_kind, request_bytes, threads) as buffers:
                io = DirectFileIO(num_threads=threads, name="tencache-drive-rate")
                try:
                    trials.extend(_one_round(io, buffers, buffers_kind, first, second, requests, request_bytes,
                                             deadline_s))
                    alignment = io.alignment_for(first)
                finally:
                    # before the buffers go: a trial that failed part way may have requests still moving into them
                    io.close()
                    for path in (first, second):
                        try:
                            os.remove(path)
                        except FileNotFoundError:
                            pass
    return _fastest(trials, f"tencache DirectFileIO, requests of {', '.join(_mib(size) for size in request_sizes)} "
                            f"into arena slots, {' or '.join(map(str, thread_counts))} in flight, O_DIRECT alignment "
                            f"{alignment} B (0: buffered), in {folder}"
                            + (f" (shortened by {QUICK_ENV}: one repeat, no request issued after {deadline_s:g} s, "
                               "one round at least)" if quick else ""), ARENA_BUFFERS)


def _one_round(io, buffers, buffers_kind: str, first: str, second: str, requests: int, request_bytes: int,
               deadline_s: float) -> List[Trial]:
    """Writes, reads, and both at once, of ``requests`` requests through ``io`` from ``buffers``."""
    trials = []
    # Twice: a new file's blocks are allocated as it is written, which was 20-40% slower here than overwriting them,
    # and the stores overwrite their swap files step after step (the fastest counts).
    for _pass in range(2):
        trials.append(_trial(io, WRITE, buffers, [(first, index) for index in range(requests)], request_bytes,
                             deadline_s, buffers_kind))
    written = trials[-1].write_bytes // request_bytes  # a deadline may have cut the file short
    trials.append(_trial(io, READ, buffers, [(first, index) for index in range(written)], request_bytes, deadline_s,
                         buffers_kind))
    # Reads of the first file interleaved with writes of the second: an update reading sub-group i + 1 while writing
    # i. The second file is written once untimed first, so that the mixed trial overwrites it too (a new file's block
    # allocation would be timed otherwise).
    _trial(io, WRITE, buffers, [(second, index) for index in range(written)], request_bytes, deadline_s, buffers_kind)
    mixed = [(first if index % 2 == 0 else second, index // 2) for index in range(2 * written)]
    trials.append(_trial(io, BOTH, buffers, mixed, request_bytes, deadline_s, buffers_kind))
    return trials


@contextlib.contextmanager
def trial_buffers(kind: str, nbytes: int, count: int):
    """``count`` uint8 tensors of ``nbytes``, each filled with its index + 1 (not zeros: a file system may treat zero
    pages specially), of ``kind``: ARENA_BUFFERS, slots of a native arena (the stores' kind: huge pages, locked
    where the memlock limit allows, else left pageable without a warning); TORCH_BUFFERS, 4 KiB-aligned torch.empty
    memory (DeepSpeed's swap buffers). The arena is closed on leaving: its tensors must not be used after the block,
    nor any request into them still be moving (close the engine inside it)."""
    from .direct_io import aligned_buffer
    if kind not in (ARENA_BUFFERS, TORCH_BUFFERS):
        raise ValueError(f"trial buffers: {kind!r} is not {ARENA_BUFFERS!r} or {TORCH_BUFFERS!r}")
    arena = None
    if kind == ARENA_BUFFERS:
        import warnings
        from ..memory.arena import PinnedArena
        with warnings.catch_warnings():  # a memlock limit below the slots leaves them pageable: still huge pages
            warnings.simplefilter("ignore", RuntimeWarning)
            arena = PinnedArena({nbytes: count}, lock="best_effort", register_with_cuda=False,
                                name="tencache-drive-rate")
    try:
        if arena is None:
            buffers = [aligned_buffer(nbytes) for _ in range(count)]
        else:
            import torch
            buffers = [arena.alloc(nbytes).as_tensor(torch.uint8, nbytes) for _ in range(count)]
        for index, buffer in enumerate(buffers):
            buffer.fill_(index + 1)
        yield buffers
    finally:
        if arena is not None:
            arena.close()


def trial_file(folder: str, kind: str) -> str:
    """The path of this process's trial file of ``kind`` (lower-case letters) in ``folder``. The host is in its name
    because the folder measured may be shared between nodes (NFS, Lustre), whose processes cannot be seen from here:
    without it another node's cleanup would take a live measurement's pid for a dead one and remove its file, and
    two nodes' measurements with the same pid would write the same file."""
    return os.path.join(folder, f"{TRIAL_FILE_PREFIX}{os.getpid()}-{kind}@{socket.gethostname()}.bin")


def remove_stale_trial_files(folder: str) -> List[str]:
    """Remove trial files that a measurement killed before its cleanup left in ``folder`` (a calibration stopped by
    its timeout leaves up to 2 GiB): this host's whose process is gone, another host's once nothing has written them
    for an hour (io/stale_files.py). Returns the paths removed."""
    def pid_of(name: str) -> Optional[int]:
        match = _TRIAL_FILE.fullmatch(name)
        return None if match is None else pid_in_name(match["pid"], "")

    def host_of(name: str) -> Optional[str]:  # None: a name that records no host, judged as this host's
        match = _TRIAL_FILE.fullmatch(name)
        return None if match is None else match["host"]

    return remove_files_of_dead_processes(folder, pid_of, host_of)


def _fastest(trials: Sequence[Trial], method: str, buffers: Optional[str] = None) -> DriveRate:
    """The fastest rates among ``trials`` (those into ``buffers`` only, where given), all of them kept."""
    def best(mode: str) -> Optional[Trial]:
        done = [trial for trial in trials if trial.mode == mode and trial.seconds > 0
                and (buffers is None or trial.buffers == buffers)]
        return max(done, key=lambda trial: trial.bytes_per_s) if done else None

    reads, writes, both = best(READ), best(WRITE), best(BOTH)
    if reads is None or writes is None or both is None or not reads.read_bytes or not writes.write_bytes:
        raise OSError(f"the drive measurement moved no bytes ({method})")
    return DriveRate(reads.read_bytes_per_s, writes.write_bytes_per_s, both.read_bytes_per_s,
                     both.write_bytes_per_s, method, tuple(trials))


def _trial(io, mode: str, buffers, requests: Sequence[Tuple[str, int]], request_bytes: int,
           deadline_s: float, buffers_kind: str) -> Trial:
    """Issue ``requests`` ((path, index): offset index x request_bytes) with len(buffers) in flight; in mode BOTH
    the first file is read and any other written. Stops issuing at the deadline (after one request per buffer);
    waits for what is in flight."""
    moved = {True: 0, False: 0}  # is a write -> bytes
    pending = []
    started = time.perf_counter()
    first_path = requests[0][0] if requests else None
    for number, (path, index) in enumerate(requests):
        if len(pending) >= len(buffers):
            is_write, future = pending.pop(0)
            moved[is_write] += future.result()
        if number >= len(buffers) and time.perf_counter() - started > deadline_s:  # one round at least
            break
        is_write = mode == WRITE or (mode == BOTH and path != first_path)
        submit = io.write if is_write else io.read
        pending.append((is_write, submit(buffers[number % len(buffers)], path, request_bytes,
                                         index * request_bytes)))
    for is_write, future in pending:
        moved[is_write] += future.result()
    # A write through O_DIRECT is on the drive when its request completes; an fsync then only flushes the drive's own
    # cache, which the stores never ask for between steps (and which halved the write rate timed on this VM's virtual
    # disk: 0.37-0.49 against 0.85-1.08 GB/s, with the writes themselves done at the higher rate). Only where the
    # engine fell back to buffered writes (alignment 0) are the bytes still in the page cache: there the fsync counts.
    # There the files' pages are dropped after each trial too (untimed), or the trials that follow read the page
    # cache, not the drive (helper-187's review; doctor's own buffered probe did so already).
    buffered = [path for path in dict.fromkeys(path for path, _index in requests) if io.alignment_for(path) == 0]
    if moved[True]:
        for path in buffered:
            if path != first_path or mode == WRITE:
                _fsync(path)
    elapsed = time.perf_counter() - started
    for path in buffered:
        _drop_from_page_cache(path)
    return Trial(mode, request_bytes, len(buffers), moved[False], moved[True], elapsed, buffers_kind)


def _fsync(path: str) -> None:
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _drop_from_page_cache(path: str) -> None:
    """The file's clean pages out of the page cache (written and synced: nothing is lost), where the OS allows."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def _mib(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB"
