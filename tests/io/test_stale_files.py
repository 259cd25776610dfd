"""Reading a process id out of a file name (io/stale_files.py): only a real pid between the prefix and the suffix;
anything else is not such a file, so nothing is removed on its account."""
import os

import pytest

from tencache_ds.io.stale_files import pid_in_name, remove_files_of_dead_processes


@pytest.mark.parametrize("name, pid", [
    (".tmp.123.sharing", 123),
    (".tmp.0.sharing", None),            # not a process: os.kill(0, 0) would signal our own group
    (".tmp.²3.sharing", None),           # a digit to str.isdigit, not to int
    (".tmp.99999999999.sharing", None),  # above any pid_max
    (".tmp..sharing", None),
    ("other.123.sharing", None),
    (".tmp.123.bin", None),
])
def test_a_pid_is_read_only_where_one_stands(name, pid):
    assert pid_in_name(name, ".tmp.", ".sharing") == pid


def test_only_files_of_processes_that_are_gone_are_removed(tmp_path):
    gone = 4_000_000  # above the default pid_max: no such process
    (tmp_path / f".tmp.{gone}.sharing").write_bytes(b"x")
    (tmp_path / f".tmp.{os.getpid()}.sharing").write_bytes(b"x")
    (tmp_path / "kept.bin").write_bytes(b"x")
    removed = remove_files_of_dead_processes(str(tmp_path), lambda name: pid_in_name(name, ".tmp.", ".sharing"))
    assert removed == [str(tmp_path / f".tmp.{gone}.sharing")]
    assert sorted(os.listdir(tmp_path)) == sorted([f".tmp.{os.getpid()}.sharing", "kept.bin"])
