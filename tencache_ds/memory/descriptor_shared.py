"""Host tensors another process can map through a file descriptor. Owns: making one (``empty_shared_by_descriptor``)
in a memory file of its own (``memfd_create``), and saying when torch would copy it into /dev/shm all the same.

Why: a checkpoint engine that writes after its save returns (DeepSpeed's decoupled writer) is handed a state dict
that torch's multiprocessing pickles onto a queue, and pickling moves each tensor's storage into shared memory: a
file in /dev/shm, which containers often cap (Docker's default is 64 MiB). The fp32 masters tencache puts in a ZeRO
file are 4 bytes a parameter, so such a save stopped with "unable to allocate shared memory(shm) ... No space left
on device", where stock's NVMe checkpoint, which holds no masters, was saved. A storage that already maps a file by
its descriptor is shared as it is (torch sends the descriptor: ``UntypedStorage._share_fd_cpu_``, under torch's
default "file_descriptor" strategy); a memory file is not in /dev/shm, so its size is not capped there, writes
nothing to a drive, and is freed when the last process that maps it lets it go.
"""
import os

import torch
import torch.multiprocessing

from ..log import logger

_warned = []


def empty_shared_by_descriptor(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised 1-D tensor of ``numel`` ``dtype`` elements in a memory file of its own. Where the OS or torch
    cannot make one (no ``memfd_create``, or a torch without ``UntypedStorage._new_shared_fd_cpu``, what its own
    queues use to receive a storage): anonymous memory, said once in the log."""
    if not hasattr(os, "memfd_create") or not hasattr(torch.UntypedStorage, "_new_shared_fd_cpu"):
        if not _warned:
            _warned.append(True)
            logger.warning("no memory file can be shared by descriptor here (os.memfd_create or torch's "
                           "UntypedStorage._new_shared_fd_cpu missing): a checkpoint writer's queue will copy the "
                           "masters into /dev/shm")
        return torch.empty(numel, dtype=dtype)
    nbytes = max(1, numel * torch.empty((), dtype=dtype).element_size())
    fd = os.memfd_create("tencache-masters", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        # maps the file through a duplicate of the descriptor, which the storage keeps (and is shared by)
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)
    finally:
        os.close(fd)
    return torch.empty(0, dtype=dtype).set_(storage, 0, (numel,), (1,))


def copied_into_dev_shm() -> bool:
    """Would torch's multiprocessing still copy such a tensor into /dev/shm? Under the "file_system" sharing strategy
    (``torch.multiprocessing.set_sharing_strategy``) it shares storages by a file name there, whatever they are."""
    return torch.multiprocessing.get_sharing_strategy() == "file_system"
