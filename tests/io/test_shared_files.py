"""Files shared by hard links between a swap folder and a checkpoint (io/shared_files.py), on real files: a placed
file is a link where the file system allows and a copy elsewhere, a name is replaced without writing through it, and
no write through LinkSafeIO changes a file's other names."""
import os
import shutil

import pytest
import torch

from tencache_ds.io.direct_io import DirectFileIO
from tencache_ds.io.shared_files import (LinkSafeIO, give_own_file, make_own_file, place, room_to_write_again,
                                         unshare_folder)
from tencache_ds.units import fmt_bytes
from tencache_ds.memory.pool import BufferPool

SHM = "/dev/shm"


def write(path, data: bytes):
    with open(path, "wb") as handle:
        handle.write(data)


def read(path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def test_place_links_on_one_file_system_and_replaces_the_target_without_writing_through_it(tmp_path):
    swap, checkpoint, old = tmp_path / "swap", tmp_path / "ckpt", tmp_path / "old"
    write(swap, b"new" * 100)
    write(old, b"old" * 100)
    os.link(old, checkpoint)  # the target is another checkpoint's file: it must keep its bytes
    placed = place(str(swap), str(checkpoint))
    assert placed.linked and placed.bytes_written == 0
    assert os.path.samefile(swap, checkpoint)
    assert read(old) == b"old" * 100
    assert place(str(swap), str(checkpoint)).linked  # already the same inode: nothing to do
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "old", "swap"]  # no temporary file left behind


@pytest.mark.skipif(not os.path.isdir(SHM), reason="needs /dev/shm")
def test_place_copies_across_file_systems_from_the_host_copy_when_given(tmp_path):
    swap = tmp_path / "swap"
    write(swap, b"\x01" * 8192)
    if os.stat(SHM).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the same file system as the test's folder")
    target = os.path.join(SHM, f"tencache-test-{os.getpid()}.swp")
    try:
        placed = place(str(swap), target, fill=lambda handle: handle.write(b"\x02" * 4000))
        assert not placed.linked and placed.bytes_written == 8192
        assert read(target) == b"\x02" * 4000 + b"\0" * 4192  # the host copy, padded to the swap file's size
        placed = place(str(swap), target)
        assert not placed.linked and read(target) == b"\x01" * 8192
    finally:
        if os.path.exists(target):
            os.unlink(target)


def test_give_own_file_breaks_a_link_for_a_whole_or_a_partial_write(tmp_path):
    swap, checkpoint = tmp_path / "swap", tmp_path / "ckpt"
    write(swap, b"abcd" * 1024)
    os.link(swap, checkpoint)
    assert give_own_file(str(swap), whole=False)  # partial: the file is copied first, its bytes kept
    assert not os.path.samefile(swap, checkpoint) and read(swap) == read(checkpoint)
    assert not give_own_file(str(swap), whole=False)  # one name now: nothing to do
    os.unlink(swap)
    os.link(checkpoint, swap)
    assert give_own_file(str(swap), whole=True)  # whole: the write starts a new file
    assert not os.path.exists(swap) and read(checkpoint) == b"abcd" * 1024


def test_make_own_file_gives_a_linked_name_an_empty_file_of_its_size_and_copies_nothing(tmp_path):
    """Before writes that replace every byte (an fp32 master written from its partitions, piece by piece:
    integrations/deepspeed/master_write_behind.py): the checkpoint keeps its bytes, the swap file keeps its size."""
    swap, checkpoint = tmp_path / "swap", tmp_path / "ckpt"
    write(swap, b"abcd" * 1024)
    os.link(swap, checkpoint)
    assert make_own_file(str(swap))
    assert not os.path.samefile(swap, checkpoint)
    assert read(swap) == bytes(4096) and read(checkpoint) == b"abcd" * 1024
    assert not make_own_file(str(swap))  # one name now: nothing to do
    assert read(swap) == bytes(4096)


def test_writes_through_link_safe_io_never_change_a_checkpoint(tmp_path):
    io = DirectFileIO(num_threads=2)
    try:
        safe = LinkSafeIO(io)
        pool = BufferPool("t", lock="off")
        tensor = pool.acquire(1 << 16).view(torch.float32, 1 << 14)
        swap, checkpoint = str(tmp_path / "swap"), str(tmp_path / "ckpt")
        tensor.fill_(1.0)
        safe.write(tensor, swap).result()
        os.link(swap, checkpoint)
        saved = read(checkpoint)
        tensor.fill_(2.0)
        safe.write(tensor, swap).result()  # the whole file
        safe.write(tensor[:1024], swap, file_offset=4096).result()  # part of it: the swap file has one name now
        os.unlink(checkpoint)
        os.link(swap, checkpoint)
        saved_again = read(checkpoint)
        tensor.fill_(3.0)
        safe.write(tensor[:1024], swap, file_offset=4096).result()  # part of a linked file
        assert read(checkpoint) == saved_again != saved
        assert torch.frombuffer(bytearray(read(swap)), dtype=torch.float32)[1024:2048].eq(3.0).all()
        assert safe.links_broken == 2
        os.unlink(checkpoint)
        os.link(swap, checkpoint)
        io.write(tensor, swap).result()  # what LinkSafeIO prevents: without it, the write reaches the other name
        assert torch.frombuffer(bytearray(read(checkpoint)), dtype=torch.float32).eq(3.0).all()
    finally:
        io.close()


def test_unshare_folder_removes_only_the_names_a_checkpoint_shares(tmp_path):
    folder, checkpoint = tmp_path / "swap", tmp_path / "ckpt"
    folder.mkdir()
    checkpoint.mkdir()
    write(folder / "shared.swp", b"s" * 10)
    write(folder / "own.swp", b"o" * 10)
    os.link(folder / "shared.swp", checkpoint / "shared.swp")
    assert unshare_folder(str(folder)) == 1
    assert sorted(os.listdir(folder)) == ["own.swp"] and read(checkpoint / "shared.swp") == b"s" * 10


def test_unshare_folder_leaves_the_files_of_another_owner(tmp_path):
    """Two engines share one swap folder: closing one unshares its own files, not the other's (still in use)."""
    folder, checkpoint = tmp_path / "swap", tmp_path / "ckpt"
    folder.mkdir()
    checkpoint.mkdir()
    for name in ("mine.swp", "theirs.swp"):
        write(folder / name, b"x" * 10)
        os.link(folder / name, checkpoint / name)
    assert unshare_folder(str(folder), lambda name: name.startswith("mine")) == 1
    assert sorted(os.listdir(folder)) == ["theirs.swp"]


def test_files_shared_beyond_the_room_left_are_named_with_the_folder_and_what_training_on_needs(tmp_path):
    """A save that linked more of a swap folder into a checkpoint than its file system has free says so (gpt2-2.7b
    here, 2026-12-06: 31 GB of swap files shared, 11 GB free; the next step's new files would not fit); one that
    linked less says nothing."""
    free = shutil.disk_usage(tmp_path).free
    assert room_to_write_again(str(tmp_path), free // 2) is None
    warning = room_to_write_again(str(tmp_path), 2 * free)
    assert warning is not None and str(tmp_path) in warning and fmt_bytes(2 * free) in warning
    assert "no space left" in warning and "another file system" in warning


def test_a_copy_onto_a_full_file_system_names_the_folder_the_file_and_the_room(tmp_path, small_tmpfs):
    """A checkpoint on another file system that fills up (a 1 MiB tmpfs; the host tier's copy written, 2 MiB): the
    error names the checkpoint's folder, the file and the room, and no temporary file is left (helper-243's review:
    a bare "No space left on device")."""
    import errno
    small = small_tmpfs("1m")
    swap = tmp_path / "0_3.tensor.swp"
    write(swap, b"\x01" * (2 << 20))
    for fill in (None, lambda handle: handle.write(b"\x02" * (2 << 20))):
        with pytest.raises(OSError) as raised:
            place(str(swap), str(small / "0_3.tensor.swp"), fill=fill)
        message = str(raised.value)
        assert raised.value.errno == errno.ENOSPC and f"{small} while copying 0_3.tensor.swp (2.00 MiB)" \
            in message and "free" in message, message
        assert os.listdir(small) == []
