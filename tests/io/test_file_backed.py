"""io/file_backed.py: a tensor whose memory is an unnamed file under a folder, its blocks reserved, shared with other
processes by its descriptor (a multiprocessing queue does not copy it into /dev/shm, as it does anonymous memory)."""
import os
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing  # noqa: F401  (registers torch's reductions with ForkingPickler)

from tencache_ds.io.file_backed import file_backed_empty


def shared_file(tensor) -> str:
    """The file the storage is shared by (torch's file_descriptor strategy), as /proc names it."""
    fd, _size = tensor.untyped_storage()._share_fd_cpu_()
    return os.readlink(f"/proc/self/fd/{fd}")


def test_a_queue_shares_it_by_its_file_where_it_moves_anonymous_memory_into_dev_shm(tmp_path):
    copy = file_backed_empty(1 << 20, torch.float32, str(tmp_path)).fill_(1.5)
    anonymous = torch.full((1 << 20,), 1.5)
    where, anonymous_where = copy.untyped_storage().data_ptr(), anonymous.untyped_storage().data_ptr()
    ForkingPickler.dumps(copy)
    ForkingPickler.dumps(anonymous)
    assert copy.untyped_storage().data_ptr() == where  # shared as it is
    assert shared_file(copy).startswith(str(tmp_path)) and shared_file(copy).endswith("(deleted)")
    assert anonymous.untyped_storage().data_ptr() != anonymous_where  # moved into shared memory
    assert shared_file(anonymous).startswith("/dev/shm/")
    assert torch.equal(copy, anonymous)
    assert os.listdir(tmp_path) == []  # nothing left under a name


def test_its_blocks_are_reserved_and_dtypes_kept(tmp_path):
    copy = file_backed_empty(3000, torch.bfloat16, str(tmp_path))
    assert copy.dtype == torch.bfloat16 and copy.shape == (3000,)
    fd, size = copy.untyped_storage()._share_fd_cpu_()
    assert size == 6000 and os.fstat(fd).st_blocks * 512 >= 6000  # posix_fallocate: no hole left to fault in


def test_a_folder_that_cannot_hold_it_is_an_oserror(tmp_path):
    with pytest.raises(OSError):
        file_backed_empty(10, torch.float32, str(tmp_path / "missing"))
