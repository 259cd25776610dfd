"""Blocks shared between two files (a reflink), where the file system allows. Owns: cloning a byte range of one file
into another (``clone_range``), and knowing whether a folder's file system clones at all (``folder_clones``), or
from one folder into another (``clones_between``).

XFS (with ``reflink=1``, mkfs.xfs's default since xfsprogs 5.1), btrfs, bcachefs and OCFS2 let one file's blocks
appear in another without copying them (``ioctl(FICLONERANGE)``); a later write to either file gets new blocks
(copy on write), so the other keeps its bytes. ext4 and tmpfs refuse (EOPNOTSUPP / EINVAL), and so does any pair of
files on two file systems (EXDEV). Ranges must start at block-aligned offsets in both files and span whole blocks
(the kernel lets only a range that ends at the source's end of file end mid-block, and then clones the whole last
block over whatever follows in the target): ``clone_range`` clones the whole blocks and leaves the rest to its
caller.
"""
import errno
import fcntl
import os
import struct
import tempfile
import threading

# _IOW(0x94, 13, struct file_clone_range { __s64 src_fd; __u64 src_offset, src_length, dest_offset; })
FICLONERANGE = 0x4020940D
# the errors that mean "this file system, or this pair of files, does not clone": the caller writes instead
_CANNOT_CLONE = {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.EPERM,
                 errno.ETXTBSY, errno.ENOSYS}

_clones_by_folders: dict = {}  # (source folder's device, target's; their real paths where they differ) -> bool
_clones_lock = threading.Lock()


def block_size(path: str) -> int:
    """The file system's block size at ``path`` (a file or folder): the unit ranges are cloned in."""
    return os.statvfs(path).f_bsize


def clone_range(source_fd: int, source_offset: int, target_fd: int, target_offset: int, length: int,
                block: int) -> int:
    """Share ``source``'s bytes [source_offset, source_offset + length) as ``target``'s [target_offset, ...), in whole
    ``block``-byte blocks. Returns how many bytes were shared: ``length`` rounded down to whole blocks, or 0 where the
    file system cannot (or the offsets are not block-aligned); the caller writes the rest."""
    whole = length // block * block
    if whole == 0 or source_offset % block or target_offset % block:
        return 0
    try:
        fcntl.ioctl(target_fd, FICLONERANGE, struct.pack("qQQQ", source_fd, source_offset, whole, target_offset))
    except OSError as err:
        if err.errno in _CANNOT_CLONE:
            return 0
        raise
    return whole


def folder_clones(folder: str) -> bool:
    """Does the file system holding ``folder`` (which must exist) clone ranges? Probed once per file system, with
    two one-block files in ``folder`` that are removed afterwards."""
    return clones_between(folder, folder)


def clones_between(source_folder: str, target_folder: str) -> bool:
    """Can a file in ``source_folder`` share its blocks with one in ``target_folder`` (both must exist)? One file
    system is not enough: before Linux 5.18 a clone across two mounts of it (bind mounts: a container's volumes)
    fails with EXDEV. Probed once per pair of folders (once per file system for one folder), with a one-block file
    in each, removed afterwards."""
    # (two devices may still clone: btrfs subvolumes have a device each; where they cannot, the probe's clone fails
    # with EXDEV: helper-157's review)
    devices = (os.stat(source_folder).st_dev, os.stat(target_folder).st_dev)
    paths = (os.path.realpath(source_folder), os.path.realpath(target_folder))
    key = devices if paths[0] == paths[1] else devices + paths
    with _clones_lock:
        if key not in _clones_by_folders:
            _clones_by_folders[key] = _probe(source_folder, target_folder)
        return _clones_by_folders[key]


def _probe(source_folder: str, target_folder: str) -> bool:
    block = block_size(target_folder)
    with tempfile.TemporaryFile(dir=source_folder) as source, tempfile.TemporaryFile(dir=target_folder) as target:
        source.write(b"\x5a" * block)
        source.flush()
        target.truncate(block)
        if clone_range(source.fileno(), 0, target.fileno(), 0, block, block) != block:
            return False
        target.seek(0)
        return target.read(block) == b"\x5a" * block
