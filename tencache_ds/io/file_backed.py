"""Host tensors whose memory is a file on a given folder's file system, not anonymous memory. Owns: making one
(``file_backed_empty``), with its disk space reserved first.

Why: a checkpoint engine that writes after its save returns (DeepSpeed's decoupled writer) is handed a state dict
that torch's multiprocessing pickles onto a queue, and pickling moves each tensor's storage into shared memory: a
file in /dev/shm, which containers often cap (Docker's default is 64 MiB). The fp32 masters tencache puts in a ZeRO
file are 4 bytes a parameter, so such a save stopped with "unable to allocate shared memory(shm) ... No space left
on device", where stock's NVMe checkpoint, which holds no masters, was saved. A storage that already maps a file by
its descriptor is shared as it is (torch sends the descriptor, ``UntypedStorage._share_fd_cpu_``), so these copies
never touch /dev/shm. The file has no name (``O_TMPFILE``, or removed right after it is made): nothing is left
behind, and its blocks are freed when the last process that maps it lets it go. Its pages are page cache: the
kernel may write them to the folder's drive while the writer holds them, which a copy in /dev/shm never costs.
"""
import os
import uuid

import torch


def file_backed_empty(numel: int, dtype: torch.dtype, folder: str) -> torch.Tensor:
    """An uninitialised 1-D tensor of ``numel`` ``dtype`` elements in a file of its own under ``folder``, the file's
    blocks reserved (``posix_fallocate``): a full file system is an OSError (ENOSPC) here, not a SIGBUS when a page
    is first written. Raises OSError as the file system does. With a torch that cannot map a descriptor
    (``UntypedStorage._new_shared_fd_cpu``, what its own queues use to receive a storage), anonymous memory."""
    if not hasattr(torch.UntypedStorage, "_new_shared_fd_cpu"):
        return torch.empty(numel, dtype=dtype)
    nbytes = max(1, numel * torch.empty((), dtype=dtype).element_size())
    fd = _unnamed_file(folder)
    try:
        os.posix_fallocate(fd, 0, nbytes)
        # maps the file through a duplicate of the descriptor, which the storage keeps (and shares by)
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)
    finally:
        os.close(fd)
    return torch.empty(0, dtype=dtype).set_(storage, 0, (numel,), (1,))


def _unnamed_file(folder: str) -> int:
    try:
        return os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o600)
    except OSError:  # a file system without O_TMPFILE: a named file, removed at once
        path = os.path.join(folder, f".tencache-copy-{uuid.uuid4().hex}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.unlink(path)
        return fd
