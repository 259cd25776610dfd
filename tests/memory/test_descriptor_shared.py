"""memory/descriptor_shared.py: a tensor in a memory file of its own, which torch's multiprocessing shares by its
descriptor, as it is, where it moves anonymous memory into /dev/shm (what a checkpoint writer's queue does)."""
import os

import torch

from tencache_ds.memory.descriptor_shared import copied_into_dev_shm, empty_shared_by_descriptor


def shared_as(tensor):
    """What torch's queue does to share ``tensor`` (reduce_storage, "file_descriptor" strategy): the file it sends,
    and whether the storage stayed where it was."""
    where = tensor.untyped_storage().data_ptr()
    fd, _size = tensor.untyped_storage()._share_fd_cpu_()
    return os.readlink(f"/proc/self/fd/{fd}"), tensor.untyped_storage().data_ptr() == where


def test_shared_as_it_is_by_its_memory_file_where_anonymous_memory_moves_into_dev_shm():
    copy = empty_shared_by_descriptor(1 << 20, torch.float32).fill_(1.5)
    anonymous = torch.full((1 << 20,), 1.5)
    assert not copied_into_dev_shm()  # torch's default strategy on Linux
    name, stayed = shared_as(copy)
    assert name.startswith("/memfd:") and stayed
    name, stayed = shared_as(anonymous)
    assert name.startswith("/dev/shm/") and not stayed
    assert torch.equal(copy, anonymous)


def test_dtype_and_size():
    copy = empty_shared_by_descriptor(3000, torch.bfloat16)
    assert copy.dtype == torch.bfloat16 and copy.shape == (3000,) and copy.untyped_storage().nbytes() == 6000
