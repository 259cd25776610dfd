"""The O_DIRECT alignment of a file or folder. Owns: asking the kernel and the block device what address, length and
file offset alignment direct I/O needs there. Does not own: caching the answer or choosing the I/O path
(direct_io.py).

O_DIRECT fails with EINVAL when the buffer address, the length or the file offset is not a multiple of what the
file system and device need: 512 bytes on most disks, 4 KiB on "4Kn" drives (4 KiB logical sectors), which are
common among large NVMe drives. Where it comes from, most precise first:

1. ``statx(STATX_DIOALIGN)``: ``stx_dio_mem_align`` (address) and ``stx_dio_offset_align`` (offset and length),
   Linux 6.1 and later, for regular files on file systems that report it (ext4, xfs, f2fs, block devices);
   both 0 means the file system has no O_DIRECT for this file;
2. the logical sector size of the block device holding the folder,
   ``/sys/dev/block/MAJ:MIN/queue/logical_block_size`` (for a partition, its parent disk's);
3. ``SAFE_ALIGN_BYTES`` (4 KiB), which every common device accepts.

We use one number for address, length and offset, the larger of the two the kernel reports: our buffers are
4 KiB-aligned anyway, so being strict about the address costs nothing.
"""
import ctypes
import os
import platform
import struct
from typing import Optional, Tuple

SAFE_ALIGN_BYTES = 4096  # fallback when nothing better is known: a 4Kn drive's sector, a page
MIN_ALIGN_BYTES = 512    # no block device has smaller logical sectors

# linux/stat.h
STATX_DIOALIGN = 0x00002000
AT_FDCWD = -100
_STATX_SIZE = 256                  # sizeof(struct statx), padding included
_STATX_DIO_ALIGN_OFFSET = 152      # offsetof(struct statx, stx_dio_mem_align); stx_dio_offset_align follows
_SYS_STATX = {"x86_64": 332, "aarch64": 291}  # for a libc without statx() (glibc < 2.28, some musl builds)

NO_DIRECT_IO = 0  # returned when the file system says the file cannot be opened with O_DIRECT


def direct_io_alignment(path: str) -> Tuple[int, str]:
    """``(alignment in bytes, where it came from)`` for direct I/O on ``path`` (a file or a folder).

    The alignment is a power of two >= MIN_ALIGN_BYTES, or NO_DIRECT_IO (0) when statx says the file system has
    no O_DIRECT for this file. The source is "statx", "sysfs <file>" or "fallback".
    """
    if os.path.isfile(path):
        reported = statx_dio_align(path)
        if reported is not None:
            mem_align, offset_align = reported
            if mem_align == 0 or offset_align == 0:
                return NO_DIRECT_IO, "statx"
            return _at_least_a_sector(max(mem_align, offset_align)), "statx"
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    sector = logical_sector_bytes(folder)
    if sector is not None:
        return _at_least_a_sector(sector[0]), f"sysfs {sector[1]}"
    return SAFE_ALIGN_BYTES, "fallback"


def statx_dio_align(path: str) -> Optional[Tuple[int, int]]:
    """``(stx_dio_mem_align, stx_dio_offset_align)`` for ``path``, or None where the kernel, the C library or the
    file system does not report them."""
    call = _statx_function()
    if call is None:
        return None
    buffer = ctypes.create_string_buffer(_STATX_SIZE)
    if call(AT_FDCWD, os.fsencode(path), 0, STATX_DIOALIGN, buffer) != 0:
        return None
    mask = struct.unpack_from("=I", buffer.raw, 0)[0]
    if not mask & STATX_DIOALIGN:
        return None
    return struct.unpack_from("=II", buffer.raw, _STATX_DIO_ALIGN_OFFSET)


def logical_sector_bytes(folder: str) -> Optional[Tuple[int, str]]:
    """The logical sector size of the block device holding ``folder`` and the sysfs file it was read from, or None
    for a file system without a block device of its own (tmpfs, overlayfs, NFS, btrfs' anonymous devices)."""
    try:
        device = os.stat(folder).st_dev
    except OSError:
        return None
    node = f"/sys/dev/block/{os.major(device)}:{os.minor(device)}"
    if not os.path.exists(node):
        return None
    resolved = os.path.realpath(node)
    for candidate in (resolved, os.path.dirname(resolved)):  # a partition's queue/ is its parent disk's
        sysfs_file = os.path.join(candidate, "queue", "logical_block_size")
        try:
            with open(sysfs_file) as handle:
                value = int(handle.read().strip())
        except (OSError, ValueError):
            continue
        if value > 0 and value & (value - 1) == 0:
            return value, sysfs_file
    return None


def _at_least_a_sector(value: int) -> int:
    if value <= 0 or value & (value - 1):  # not a power of two: not an answer we understand
        return SAFE_ALIGN_BYTES
    return max(MIN_ALIGN_BYTES, value)


_statx = "unresolved"


def _statx_function():
    """libc's statx(), else the raw system call, else None (not Linux, or an architecture we have no number for)."""
    global _statx  # pylint: disable=global-statement
    if _statx != "unresolved":
        return _statx
    _statx = None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p]
    if hasattr(libc, "statx"):
        libc.statx.argtypes, libc.statx.restype = argtypes, ctypes.c_int
        _statx = libc.statx
    elif platform.machine() in _SYS_STATX and hasattr(libc, "syscall"):
        number = _SYS_STATX[platform.machine()]
        syscall = libc.syscall
        syscall.restype = ctypes.c_long

        def _statx_syscall(dirfd, path, flags, mask, buffer):
            return syscall(ctypes.c_long(number), ctypes.c_int(dirfd), ctypes.c_char_p(path), ctypes.c_int(flags),
                           ctypes.c_uint(mask), buffer)
        _statx = _statx_syscall
    return _statx


__all__ = ["direct_io_alignment", "statx_dio_align", "logical_sector_bytes", "SAFE_ALIGN_BYTES",
           "MIN_ALIGN_BYTES", "NO_DIRECT_IO"]
