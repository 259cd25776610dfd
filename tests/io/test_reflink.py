"""Cloning byte ranges between files (io/reflink.py) on real file systems: an XFS image where blocks are shared and a
later write to either file leaves the other's bytes alone, and the test folder's file system (ext4 here), which
clones nothing and leaves the target untouched."""
import os

import pytest

from tencache_ds.io.reflink import block_size, clone_range, folder_clones

from test_shared_files import read, write  # tests/io is on sys.path (rootdir-relative imports)


def clone(folder, source_bytes: bytes, target_bytes: bytes, source_offset, target_offset, length):
    source, target = os.path.join(folder, "source"), os.path.join(folder, "target")
    write(source, source_bytes)
    write(target, target_bytes)
    with open(source, "rb") as src, open(target, "r+b") as dst:
        return clone_range(src.fileno(), source_offset, dst.fileno(), target_offset, length, block_size(folder))


def test_whole_blocks_are_shared_and_a_later_write_to_the_source_leaves_the_target_alone(reflink_folder):
    assert folder_clones(reflink_folder)
    block = block_size(reflink_folder)
    source = bytes(range(256)) * (3 * block // 256) + b"tail"  # three blocks and 4 bytes
    target = b"\x01" * (5 * block)
    assert clone(reflink_folder, source, target, 0, block, len(source)) == 3 * block  # the tail is the caller's
    assert read(os.path.join(reflink_folder, "target")) == target[:block] + source[:3 * block] + target[4 * block:]
    with open(os.path.join(reflink_folder, "source"), "r+b") as handle:  # training writes the swap file again
        handle.write(b"\xff" * (3 * block))
    assert read(os.path.join(reflink_folder, "target"))[block:4 * block] == source[:3 * block]


def test_unaligned_offsets_clone_nothing(reflink_folder):
    block = block_size(reflink_folder)
    assert clone(reflink_folder, b"\x02" * (2 * block), b"\x01" * (4 * block), 0, 512, 2 * block) == 0
    assert read(os.path.join(reflink_folder, "target")) == b"\x01" * (4 * block)


def test_a_file_system_that_does_not_clone_clones_nothing_and_leaves_the_target_untouched(tmp_path):
    if folder_clones(str(tmp_path)):
        pytest.skip("the test folder's file system clones ranges")
    block = block_size(str(tmp_path))
    assert clone(str(tmp_path), b"\x02" * (2 * block), b"\x01" * (2 * block), 0, 0, 2 * block) == 0
    assert read(tmp_path / "target") == b"\x01" * (2 * block)


def test_clones_between_two_folders_are_probed_between_them(reflink_folder, tmp_path):
    """Whether a swap folder's files can share blocks with a checkpoint folder's is probed from the one into the
    other (a clone across two mounts of one file system, a container's bind-mounted volumes, fails with EXDEV before
    Linux 5.18, where a probe inside one folder said yes and every master was then copied after all: helper-146's
    review): two folders of the XFS image clone, and the image and the test folder (another file system) do not."""
    from tencache_ds.io.reflink import clones_between
    first, second = os.path.join(reflink_folder, "swap"), os.path.join(reflink_folder, "checkpoints")
    os.makedirs(first, exist_ok=True)
    os.makedirs(second, exist_ok=True)
    assert clones_between(first, second) and clones_between(second, first)
    assert not clones_between(first, str(tmp_path)) and not clones_between(str(tmp_path), first)
