"""Asynchronous file reads and writes of host buffers. Owns: moving bytes between a host address range and a
file, with per-request completion. Does not own: which buffers or files (the swappers), or pinning.

Why our own engine rather than DeepSpeed's aio handle: DeepSpeed's handle only does zero-copy I/O into memory
that is CUDA-pinned or that it locked itself; anything else goes through a freshly allocated and mlock'ed
bounce buffer per request (deepspeed_cpu_op.cpp), 1.7x slower on reads here, and it can only wait for *all*
outstanding requests. The kernel needs neither: O_DIRECT wants aligned addresses and lengths, not locked
pages. So this engine reads straight into any 4 KiB-aligned buffer (locked or not) with positional
``os.preadv``/``os.pwritev`` on a small thread pool (the GIL is released during the system call), and every
request has its own future, so waiting for one tensor never waits for a prefetch far in the future.

Requests that are not O_DIRECT-compatible (unaligned address or length, or a file system without O_DIRECT such
as tmpfs) use ordinary buffered I/O on the same files; Linux keeps the two coherent.
"""
import ctypes
import dataclasses
import errno
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from ..errors import StaleFileError, TencacheResourceError
from ..units import fmt_bytes

DIRECT_ALIGN_BYTES = 512          # logical block size O_DIRECT needs for address, length and offset
CHUNK_BYTES = 16 * 1024 * 1024    # one system call moves at most this much; keeps each call short


@dataclasses.dataclass
class IoCounters:
    """Bytes and requests completed since the engine started. # SUM, protected by DirectFileIO._lock"""

    read_bytes: int = 0
    write_bytes: int = 0
    read_requests: int = 0
    write_requests: int = 0


class DirectFileIO:
    """A pool of I/O threads. ``read``/``write`` return a Future that resolves to the number of bytes moved.

    The caller keeps the buffer alive and untouched until the future is done (the engine holds a reference to
    the tensor it was given, so the memory cannot be freed under it).
    """

    def __init__(self, num_threads: int = 2, name: str = "tencache-io"):
        self._pool = ThreadPoolExecutor(max_workers=max(1, num_threads), thread_name_prefix=name)
        self._lock = threading.Lock()
        self._counters = IoCounters()
        self._no_direct_dirs = set()  # folders whose file system refused O_DIRECT

    # ----------------------------------------------------------------------------------------------- public
    def read(self, tensor, path: str, nbytes: int = None, file_offset: int = 0) -> Future:
        """Read ``nbytes`` (default: the whole tensor) from ``path`` at ``file_offset`` into ``tensor``."""
        return self._submit(False, tensor, path, nbytes, file_offset)

    def write(self, tensor, path: str, nbytes: int = None, file_offset: int = 0) -> Future:
        """Write ``nbytes`` (default: the whole tensor) of ``tensor`` to ``path`` at ``file_offset``."""
        return self._submit(True, tensor, path, nbytes, file_offset)

    def counters(self) -> IoCounters:
        with self._lock:
            return dataclasses.replace(self._counters)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # ---------------------------------------------------------------------------------------------- private
    def _submit(self, is_write, tensor, path, nbytes, file_offset) -> Future:
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError(f"I/O needs a contiguous CPU tensor, got {tensor.device} contiguous={tensor.is_contiguous()}")
        total = tensor.numel() * tensor.element_size()
        nbytes = total if nbytes is None else nbytes
        if nbytes > total:
            raise ValueError(f"cannot move {nbytes} bytes through a {total}-byte tensor ({path})")
        return self._pool.submit(self._run, is_write, tensor, tensor.data_ptr(), nbytes, path, file_offset)

    def _run(self, is_write: bool, tensor, address: int, nbytes: int, path: str, file_offset: int) -> int:
        del tensor  # held by the submitted call only to keep the memory alive until the request ran
        view = memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B") if nbytes else memoryview(b"")
        fd = self._open(path, is_write, self._direct_ok(address, nbytes, file_offset))
        try:
            done = 0
            while done < nbytes:
                chunk = view[done:done + CHUNK_BYTES]
                if is_write:
                    moved = os.pwritev(fd, [chunk], file_offset + done)
                else:
                    moved = os.preadv(fd, [chunk], file_offset + done)
                    if moved == 0:
                        size = os.fstat(fd).st_size
                        raise StaleFileError(
                            f"swap file {path} holds {size} bytes but {file_offset + nbytes} were expected: it was "
                            f"truncated or written by another run; delete the swap folder and restart")
                done += moved
        except OSError as err:
            raise self._explain(err, path, nbytes, is_write) from err
        finally:
            os.close(fd)
        with self._lock:
            if is_write:
                self._counters.write_bytes += nbytes
                self._counters.write_requests += 1
            else:
                self._counters.read_bytes += nbytes
                self._counters.read_requests += 1
        return nbytes

    def _direct_ok(self, address: int, nbytes: int, file_offset: int) -> bool:
        return (address % DIRECT_ALIGN_BYTES == 0 and nbytes % DIRECT_ALIGN_BYTES == 0
                and file_offset % DIRECT_ALIGN_BYTES == 0)

    def _open(self, path: str, is_write: bool, direct: bool) -> int:
        flags = (os.O_WRONLY | os.O_CREAT) if is_write else os.O_RDONLY
        folder = os.path.dirname(path)
        if direct and folder not in self._no_direct_dirs:
            try:
                return os.open(path, flags | os.O_DIRECT, 0o644)
            except OSError as err:
                if err.errno != errno.EINVAL:  # EINVAL: this file system has no O_DIRECT (tmpfs)
                    raise self._explain(err, path, 0, is_write) from err
                self._no_direct_dirs.add(folder)
        try:
            return os.open(path, flags, 0o644)
        except OSError as err:
            raise self._explain(err, path, 0, is_write) from err

    @staticmethod
    def _explain(err: OSError, path: str, nbytes: int, is_write: bool) -> Exception:
        folder = os.path.dirname(path)
        if err.errno == errno.ENOSPC:
            free = shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
            return TencacheResourceError(
                f"no space left on {folder} while writing {fmt_bytes(nbytes)} to {os.path.basename(path)} "
                f"({fmt_bytes(free)} free): free space there or point zero_optimization.offload_*.nvme_path at a "
                f"larger device")
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return TencacheResourceError(f"cannot {'write' if is_write else 'read'} swap file {path}: "
                                         f"{os.strerror(err.errno)}; check zero_optimization.offload_*.nvme_path")
        if err.errno == errno.ENOENT and not is_write:
            return StaleFileError(f"swap file {path} is missing: it was never written by this run or was deleted")
        return err
