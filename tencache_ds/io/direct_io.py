"""Asynchronous file reads and writes of host buffers. Owns: moving bytes between a host address range and a
file, with per-request completion. Does not own: which buffers or files (the swappers), or pinning.

Why our own engine rather than DeepSpeed's aio handle: DeepSpeed's handle only does zero-copy I/O into memory
that is CUDA-pinned or that it locked itself; anything else goes through a freshly allocated and mlock'ed
bounce buffer per request (deepspeed_cpu_op.cpp), 1.7x slower on reads here, and it can only wait for *all*
outstanding requests. The kernel needs neither: O_DIRECT wants aligned addresses and lengths, not locked
pages. So this engine reads straight into any 4 KiB-aligned buffer (locked or not) with positional
``os.preadv``/``os.pwritev`` on a small thread pool (the GIL is released during the system call), and every
request has its own future, so waiting for one tensor never waits for a prefetch far in the future.

O_DIRECT needs the address, length and file offset aligned to what the folder's file system and device need
(alignment.py reads it once per folder: 512 B on most disks, 4 KiB on 4Kn drives). A request that is not aligned
uses ordinary buffered I/O on the same file (Linux keeps the two coherent); a request that starts aligned but
ends in a partial sector moves the aligned part with O_DIRECT and the tail buffered. A file system without
O_DIRECT (EINVAL at open), or a device stricter than it said (EINVAL on the transfer), turns the folder buffered.

Which waiting request a free thread takes (``_WaitingRequests``): the oldest of the kind fewer threads are moving,
reads or writes, so that where both wait a read and a write are in flight together; the oldest overall where only
one kind waits or both run alike. First come, first served put the optimizer's update into lockstep on this
project's VM: both threads wrote the last sub-group's two moments, then both read the next one's (the two
requests of a kind come together), and the reads the update waited for queued behind two writes (docs/benchmarks.md,
"A read beside a write"; on this VM the drive's rate is about the same either way: "The next sub-group read beside
the last one's writes"). A store never depends on the order: a read of a tensor waits for that tensor's own write
(cache/transfers.py ``wait_write``).

A request above ``PIECE_BYTES`` waits as pieces of that size, each taken on its own, so that the choice is made
again every piece. Whole, two 400 MB writes behind took both threads a moment before the next sub-group's read
came, and the read waited for them: the update still wrote two at once, then read two, a sub-group in three (the
order above could only choose among requests already waiting). A request's future is done when its last piece is.
"""
import collections
import ctypes
import dataclasses
import errno
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Deque, Dict, Optional, Tuple

from ..errors import StaleFileError, TencacheResourceError
from ..log import logger
from ..units import fmt_bytes
from .activity import PROCESS_ACTIVITY, IoActivity
from .alignment import NO_DIRECT_IO, direct_io_alignment

CHUNK_BYTES = 16 * 1024 * 1024    # one system call moves at most this much; keeps each call short
# A request above this waits as pieces of it, each taken by a thread on its own (the module's docstring says why):
# 50-60 ms of one thread's transfer on this project's VM. A multiple of every O_DIRECT alignment, so each piece of
# an aligned request is aligned.
PIECE_BYTES = 4 * CHUNK_BYTES
# Forces the O_DIRECT alignment of every folder (bytes, a power of two), e.g. 4096 to act like a 4Kn drive in tests.
ALIGN_ENV = "TENCACHE_DIRECT_ALIGN_BYTES"


def store_io_threads(intra_op_parallelism: int) -> int:
    """I/O threads of one swapper's engine: DeepSpeed's aio.intra_op_parallelism, at least 2 (a read and a write
    in flight at once). The swappers and the drive measurement (drive_rate.py) both use it."""
    return max(2, int(intra_op_parallelism))


def aligned_buffer(nbytes: int):
    """A 4 KiB-aligned pageable tensor of ``nbytes`` bytes (O_DIRECT needs the address aligned): torch.empty memory
    of 4 KiB pages, as DeepSpeed's swap buffers are (io/drive_rate.py, TORCH_BUFFERS)."""
    import torch  # imported here so that importing this module stays light
    raw = torch.empty(nbytes + 4096, dtype=torch.uint8)
    offset = (-raw.data_ptr()) % 4096
    return raw[offset:offset + nbytes]


class _WaitingRequests:
    """Requests waiting for an I/O thread, reads apart from writes, and how many of each the threads move now.
    Owns: which request a free thread takes (the module's docstring says why). Not thread-safe: the engine's lock
    guards it."""

    def __init__(self):
        self._queues: Dict[bool, Deque[Tuple[int, object]]] = {False: collections.deque(), True: collections.deque()}
        self.running: Dict[bool, int] = {False: 0, True: 0}  # COUNT: requests being moved, by is_write
        self._arrivals = 0  # COUNT: requests ever put, for their age

    def put(self, is_write: bool, request) -> None:
        self._arrivals += 1
        self._queues[is_write].append((self._arrivals, request))

    def remove(self, is_write: bool, request, pieces: int) -> int:
        """Take back up to ``pieces`` of ``request``'s pieces still waiting (no task will take them); returns how
        many. Items are ``(request, start, end)``."""
        queue = self._queues[is_write]
        mine = [item for item in queue if item[1][0] is request][:max(0, pieces)]
        for item in mine:
            queue.remove(item)
        return len(mine)

    def take(self):
        """(is_write, request) for a thread that is free, counted as running until ``done``; None when nothing
        waits. E.g. one write running, a write and a read waiting: the read, although the write came first."""
        reads, writes = self._queues[False], self._queues[True]
        if not reads and not writes:
            return None
        if reads and writes and self.running[False] != self.running[True]:
            is_write = self.running[True] < self.running[False]
        else:
            is_write = not reads or bool(writes and writes[0][0] < reads[0][0])
        self.running[is_write] += 1
        return is_write, self._queues[is_write].popleft()[1]

    def done(self, is_write: bool) -> None:
        self.running[is_write] -= 1


@dataclasses.dataclass(eq=False)
class _Request:
    """One read or write submitted: its pieces wait in ``_WaitingRequests`` as ``(request, start, end)``; the
    engine's lock guards ``pieces_left``, ``failure`` and ``cancelled``."""

    future: Future
    is_write: bool
    tensor: object  # held only so that the memory cannot be freed while a piece moves it
    address: int
    nbytes: int
    path: str
    file_offset: int
    pieces_left: int = 0
    started: bool = False
    cancelled: bool = False
    failure: Optional[BaseException] = None

    def pieces(self, piece_bytes: int):
        """``(start, end)`` byte ranges of ``piece_bytes`` (one empty range for an empty request)."""
        return [(start, min(start + piece_bytes, self.nbytes)) for start in range(0, self.nbytes, piece_bytes)] \
            or [(0, 0)]


class _DirectRefused(Exception):
    """The device refused an O_DIRECT transfer (EINVAL): stricter than the alignment we were told."""


@dataclasses.dataclass
class IoCounters:
    """Bytes and requests issued since the engine started, less those that failed. # SUM, protected by
    DirectFileIO._lock

    Counted when issued, not when done, so that a training step's bytes (integrations/deepspeed/stats.py) are
    attributed to the step that issued them: counted when done, a write an update left behind fell into the next
    step's window wherever it finished after the step ended (gpt2-1.3b's per-step writes, steady at about 12.7 GiB,
    read 11.4 to 12.7 GiB from step to step)."""

    read_bytes: int = 0
    write_bytes: int = 0
    read_requests: int = 0
    write_requests: int = 0


class DirectFileIO:
    """A pool of I/O threads. ``read``/``write`` return a Future that resolves to the number of bytes moved.

    The caller keeps the buffer alive and untouched until the future is done (the engine holds a reference to
    the tensor it was given, so the memory cannot be freed under it).
    """

    def __init__(self, num_threads: int = 2, name: str = "tencache-io", align_bytes: Optional[int] = None,
                 activity: IoActivity = PROCESS_ACTIVITY, files: str = "swap file",
                 folder_set_by: str = "zero_optimization.offload_*.nvme_path", piece_bytes: int = PIECE_BYTES):
        """``align_bytes`` forces the O_DIRECT alignment of every folder (tests, or a device that misreports it);
        None reads it per folder (alignment.py), unless the TENCACHE_DIRECT_ALIGN_BYTES variable is set.
        ``activity``: where executing requests are counted (activity.py; the process's tracker by default).
        ``files`` (what its files are) and ``folder_set_by`` (what the user sets to put them elsewhere) word its
        errors: a full disk or a refused file names them. ``piece_bytes``: the size a request above it waits as
        pieces of (tests make it small); a multiple of every O_DIRECT alignment used."""
        if align_bytes is None and os.environ.get(ALIGN_ENV):
            try:
                align_bytes = int(os.environ[ALIGN_ENV])
            except ValueError:
                raise ValueError(f"{ALIGN_ENV}={os.environ[ALIGN_ENV]!r}: O_DIRECT alignment must be a power of two "
                                 f"in bytes") from None
        if align_bytes is not None and (align_bytes <= 0 or align_bytes & (align_bytes - 1)):
            raise ValueError(f"O_DIRECT alignment must be a power of two, got {align_bytes} "
                             f"(align_bytes or {ALIGN_ENV})")
        if piece_bytes <= 0 or piece_bytes % 4096:
            raise ValueError(f"piece_bytes must be a positive multiple of 4096 (every O_DIRECT alignment divides "
                             f"it), got {piece_bytes}")
        self._pool = ThreadPoolExecutor(max_workers=max(1, num_threads), thread_name_prefix=name)
        # Reentrant: close() takes it, and the swappers' finalizers call close() from whatever thread the garbage
        # collector runs in, which may be one holding it (in _submit, say).
        self._lock = threading.RLock()
        self._waiting = _WaitingRequests()  # guarded by _lock; each piece submits one task that takes one
        self._closed = False  # guarded by _lock
        # guarded by _lock: a thread is inside the pool's submit, which holds the pool's own (plain) lock, so a close
        # from a finalizer the garbage collector runs there must not shut the pool down (it would wait for that lock
        # for good: helper-160's review); the submit does it once it is out (``_shutdown_owed``)
        self._submitting = False
        self._shutdown_owed = False
        self._piece_bytes = piece_bytes
        self._counters = IoCounters()
        self._forced_align = align_bytes
        self._align_by_dir = {}  # folder -> O_DIRECT alignment in bytes; NO_DIRECT_IO (0): buffered only
        self.activity = activity
        self._files, self._folder_set_by = files, folder_set_by

    # ----------------------------------------------------------------------------------------------- public
    def read(self, tensor, path: str, nbytes: int = None, file_offset: int = 0) -> Future:
        """Read ``nbytes`` (default: the whole tensor) from ``path`` at ``file_offset`` into ``tensor``."""
        return self._submit(False, tensor, path, nbytes, file_offset)

    def write(self, tensor, path: str, nbytes: int = None, file_offset: int = 0) -> Future:
        """Write ``nbytes`` (default: the whole tensor) of ``tensor`` to ``path`` at ``file_offset``."""
        return self._submit(True, tensor, path, nbytes, file_offset)

    def alignment_for(self, path: str) -> int:
        """The O_DIRECT alignment used for files in ``path``'s folder (0: buffered only), read once per folder."""
        folder = os.path.dirname(os.path.abspath(path))
        align = self._align_by_dir.get(folder)
        if align is None:
            align = self._forced_align if self._forced_align is not None else direct_io_alignment(path)[0]
            self._align_by_dir[folder] = align  # a race only repeats the look-up
        return align

    def counters(self) -> IoCounters:
        with self._lock:
            return dataclasses.replace(self._counters)

    def close(self, wait: bool = True) -> None:
        """Stop the I/O threads once the requests submitted are done; ``wait``: until then (not from a finalizer,
        which may run in one of them). A request submitted after this is refused before it waits: queued, a task
        of an older request could have taken it, and then that older one had no task left."""
        with self._lock:
            self._closed = True
            if self._submitting and not wait:
                self._shutdown_owed = True
                return
        self._pool.shutdown(wait=wait)

    # ---------------------------------------------------------------------------------------------- private
    def _submit(self, is_write, tensor, path, nbytes, file_offset) -> Future:
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError(f"I/O needs a contiguous CPU tensor, got {tensor.device} contiguous={tensor.is_contiguous()}")
        total = tensor.numel() * tensor.element_size()
        nbytes = total if nbytes is None else nbytes
        if nbytes > total:
            raise ValueError(f"cannot move {nbytes} bytes through a {total}-byte tensor ({path})")
        request = _Request(Future(), is_write, tensor, tensor.data_ptr(), nbytes, path, file_offset)
        pieces = request.pieces(self._piece_bytes)
        try:
            self._queue(request, pieces)
        finally:  # raised or not
            with self._lock:
                shutdown_owed, self._shutdown_owed = self._shutdown_owed, False
            if shutdown_owed:  # a close came from within the pool's submit (a finalizer): made now
                self._pool.shutdown(wait=False)
        return request.future

    def _queue(self, request, pieces) -> None:
        """Under the lock, the pieces and their tasks together: close() cannot shut the pool down between the two
        (a piece queued without its task strands another request's piece, which that task may take instead).
        Raises with none of the request's bytes still moving: a caller given an error reuses its buffer (an
        interruption or a refused thread part way through had the tasks already given run on, the error kept in a
        future nobody held, or only logged for a write: helper-224)."""
        is_write, nbytes, queued, tasks = request.is_write, request.nbytes, 0, 0
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the I/O engine is closed: cannot {'write' if is_write else 'read'} "
                                   f"{request.path}")
            request.pieces_left = len(pieces)
            self._count(is_write, nbytes, 1)
            self._submitting = True
            try:
                for start, end in pieces:
                    self._waiting.put(is_write, (request, start, end))
                    queued += 1
                for _ in pieces:  # one task per piece; a task takes whichever piece _WaitingRequests picks
                    self._pool.submit(self._run_next)
                    tasks += 1
                return
            except BaseException as err:  # the pieces without a task are taken back (a task takes any piece)
                removed = self._waiting.remove(is_write, request, queued - tasks)
                request.pieces_left -= removed + len(pieces) - queued
                request.failure = err
                if tasks == 0:
                    self._count(is_write, -nbytes, -1)
                    raise
                error, finished = err, request.pieces_left == 0
            finally:
                self._submitting = False
        if finished:  # (its pieces given a task were all done before the others were taken back)
            self._finish(request)
        wait([request.future])  # the pieces given a task end first (failed: they move nothing more)
        raise error

    def _run_next(self) -> None:
        """One task per piece submitted: moves the piece ``_WaitingRequests`` picks, which need not be the one
        that submitted this task."""
        with self._lock:
            taken = self._waiting.take()
            if taken is None:  # (never: a task per piece, and a piece taken back takes its task's place)
                return
            is_write, (request, start, end) = taken
            if not request.started:
                request.started = True
                request.cancelled = not request.future.set_running_or_notify_cancel()
            run = not request.cancelled and request.failure is None
        failure = None
        try:
            if run:
                self._run_piece(request, start, end)
        except BaseException as err:  # noqa: BLE001  (the request's future raises it)
            failure = err
        finally:
            with self._lock:
                self._waiting.done(is_write)
                request.failure = request.failure or failure
                request.pieces_left -= 1
                finished = request.pieces_left == 0
        if finished:
            self._finish(request)

    def _finish(self, request: _Request) -> None:
        """The request's last piece has ended: its future gets the bytes moved, or the first failure (the bytes are
        then not counted: a failed request is retried, or its error raised)."""
        request.tensor = None
        if request.cancelled:
            return
        if request.failure is not None:
            with self._lock:
                self._count(request.is_write, -request.nbytes, -1)
            request.future.set_exception(request.failure)
        else:
            request.future.set_result(request.nbytes)

    def _count(self, is_write: bool, nbytes: int, requests: int) -> None:
        """Add to the counters. The caller holds the engine's lock."""
        if is_write:
            self._counters.write_bytes += nbytes
            self._counters.write_requests += requests
        else:
            self._counters.read_bytes += nbytes
            self._counters.read_requests += requests

    def _run_piece(self, request: _Request, start: int, end: int) -> None:
        self.activity.started()
        try:
            self._transfer(request.is_write, request.address + start, end - start, request.path,
                           request.file_offset + start)
        finally:
            self.activity.finished()

    def _transfer(self, is_write: bool, address: int, nbytes: int, path: str, file_offset: int) -> int:
        view = memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B") if nbytes else memoryview(b"")
        direct_bytes = self._direct_bytes(path, address, nbytes, file_offset)
        if direct_bytes:
            try:
                self._move(view, 0, direct_bytes, path, file_offset, is_write, direct=True)
            except _DirectRefused:
                self._stop_direct(path)
                direct_bytes = 0  # correctness first: all of it again, buffered
        if direct_bytes < nbytes or nbytes == 0:  # the unaligned tail, or all of an unaligned request
            self._move(view, direct_bytes, nbytes, path, file_offset, is_write, direct=False)
        return nbytes

    def _direct_bytes(self, path: str, address: int, nbytes: int, file_offset: int) -> int:
        """How many leading bytes of the request may use O_DIRECT: the whole aligned part when the address and
        the file offset are aligned, else none."""
        align = self.alignment_for(path)
        if align == NO_DIRECT_IO or address % align or file_offset % align:
            return 0
        return nbytes - nbytes % align

    def _move(self, view, start: int, end: int, path: str, file_offset: int, is_write: bool, direct: bool) -> None:
        """Move ``view[start:end]`` to or from ``path`` at ``file_offset + start``."""
        fd = self._open(path, is_write, direct)
        try:
            done = start
            while done < end:
                chunk = view[done:min(done + CHUNK_BYTES, end)]
                if is_write:
                    moved = os.pwritev(fd, [chunk], file_offset + done)
                else:
                    moved = os.preadv(fd, [chunk], file_offset + done)
                    if moved < len(chunk) and os.fstat(fd).st_size < file_offset + len(view):
                        size = os.fstat(fd).st_size
                        raise StaleFileError(
                            f"swap file {path} holds {size} bytes but {file_offset + len(view)} were expected: it "
                            f"was truncated or written by another run; delete the swap folder and restart")
                if moved == 0:  # (a FUSE handler's reply, a stale size): no progress, so an error, not a spin
                    raise OSError(errno.EIO, f"{path}: the file system {'wrote' if is_write else 'read'} no byte at "
                                             f"offset {file_offset + done}")
                done += moved
        except OSError as err:
            if direct and err.errno == errno.EINVAL:
                raise _DirectRefused() from err
            raise self._explain(err, path, end - start, is_write) from err
        finally:
            os.close(fd)

    def _stop_direct(self, path: str) -> None:
        folder = os.path.dirname(os.path.abspath(path))
        if self._align_by_dir.get(folder) != NO_DIRECT_IO:
            logger.warning("O_DIRECT transfers in %s fail with EINVAL at %d-byte alignment; using buffered I/O "
                           "there (set %s to the device's logical sector size to keep O_DIRECT)",
                           folder, self._align_by_dir.get(folder, 0), ALIGN_ENV)
        self._align_by_dir[folder] = NO_DIRECT_IO

    def _open(self, path: str, is_write: bool, direct: bool) -> int:
        flags = (os.O_WRONLY | os.O_CREAT) if is_write else os.O_RDONLY
        if direct:
            try:
                return os.open(path, flags | os.O_DIRECT, 0o644)
            except OSError as err:
                if err.errno != errno.EINVAL:  # EINVAL: this file system has no O_DIRECT (older tmpfs)
                    raise self._explain(err, path, 0, is_write) from err
                self._align_by_dir[os.path.dirname(os.path.abspath(path))] = NO_DIRECT_IO
        try:
            return os.open(path, flags, 0o644)
        except OSError as err:
            raise self._explain(err, path, 0, is_write) from err

    def _explain(self, err: OSError, path: str, nbytes: int, is_write: bool) -> Exception:
        folder = os.path.dirname(path)
        if err.errno == errno.ENOSPC:
            free = shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
            return TencacheResourceError(
                f"no space left on {folder} while writing {fmt_bytes(nbytes)} to {os.path.basename(path)} "
                f"({fmt_bytes(free)} free): free space there or point {self._folder_set_by} at a larger device")
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return TencacheResourceError(f"cannot {'write' if is_write else 'read'} {self._files} {path}: "
                                         f"{os.strerror(err.errno)}; check {self._folder_set_by}")
        if err.errno == errno.ENOENT and not is_write:
            return StaleFileError(f"{self._files} {path} is missing: it was never written by this run or was deleted")
        if err.errno in (errno.EDQUOT, errno.EFBIG):  # a cluster's scratch quota: as a full disk, named
            return TencacheResourceError(
                f"cannot write {fmt_bytes(nbytes)} to {self._files} {path}: {os.strerror(err.errno)}; free space "
                f"under that quota or point {self._folder_set_by} elsewhere")
        # any other (EIO, a folder deleted mid-run): the descriptor's error named no file (helper-203)
        return OSError(err.errno, f"{err.strerror or err}: "
                                  f"{'writing' if is_write else 'reading'} {self._files} {path} (set by "
                                  f"{self._folder_set_by})")
