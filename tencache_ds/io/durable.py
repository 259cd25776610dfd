"""A finished file put under a name that held a valid one, so that a crash (power loss, a kernel panic) right after
leaves the old file or the new one, never a name whose blocks were not written yet. Owns: ``replace_durably``.

A rename reaches the drive in the file system's journal, possibly before the file's own bytes do: after a crash the
name then holds a file of zeros, or of none, depending on the file system (ext4 flushes a file renamed over another
by its ``auto_da_alloc`` heuristic; XFS does not). Used where the name held a file someone relies on:
checkpoint-for-cpu rewrites the ZeRO files of an existing checkpoint, and the bench writes its summary files (which
a later `validate_estimate.py --reprice` reads). A checkpoint save is not: stock's
``torch.save`` writes its files in place without a sync, and a save under a new tag replaces nothing.

Plain module: imports nothing of torch or DeepSpeed.
"""
import errno
import os

# fsync of a directory is refused on some file systems (a few FUSE and network ones): their rename is as durable as
# they make it, and the file's own bytes were synced before it
_FOLDER_SYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}


def replace_durably(temporary: str, path: str) -> None:
    """Rename the finished file ``temporary`` over ``path`` (same folder): its bytes synced to the drive first, the
    folder's entry after."""
    descriptor = os.open(temporary, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    except OSError as err:
        if err.errno not in _FOLDER_SYNC_UNSUPPORTED:
            raise
    finally:
        os.close(folder)
