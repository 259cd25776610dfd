"""Reading a process id out of a file name (io/stale_files.py): only a real pid between the prefix and the suffix;
anything else is not such a file, so nothing is removed on its account."""
import os

import pytest

from tencache_ds.io.stale_files import UNTOUCHED_ELSEWHERE_S, pid_in_name, remove_files_of_dead_processes


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


def test_another_hosts_files_are_removed_once_nothing_has_written_them_for_an_hour(tmp_path):
    """``host_of``: a file another host made is judged by its age, not its pid (which names no process here); this
    host's, or one whose name records no host, by its pid."""
    import socket
    import time
    gone = 4_000_000
    here = socket.gethostname()
    names = {"fresh": f".tmp.{gone}@elsewhere", "old": f".tmp.{gone}@elsewhere-2", "here": f".tmp.{gone}@{here}",
             "live": f".tmp.{os.getpid()}@{here}", "no host": f".tmp.{gone}"}
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    old = time.time() - UNTOUCHED_ELSEWHERE_S - 60
    os.utime(tmp_path / names["old"], (old, old))
    removed = remove_files_of_dead_processes(str(tmp_path), lambda name: pid_in_name(name.split("@")[0], ".tmp."),
                                             lambda name: name.split("@")[1] if "@" in name else None)
    assert sorted(removed) == sorted(str(tmp_path / names[key]) for key in ("old", "here", "no host"))
    assert sorted(os.listdir(tmp_path)) == sorted([names["fresh"], names["live"]])


def test_hidden_names_carry_their_process_and_only_a_dead_ones_of_the_kinds_asked_are_removed(tmp_path):
    """``hidden_name``: the swap folder's temporary copies and a load's staged files. A start removes a killed
    process's, of the kinds it names; a live process's, another kind's and an ordinary file stay."""
    import socket

    from tencache_ds.io.stale_files import hidden_name, hidden_parts, remove_hidden_files_of_dead_processes
    name = hidden_name("exp_avg-0_9.tensor.swp", "loading")
    assert name.startswith(".") and hidden_parts(name) == ("loading", os.getpid(), socket.gethostname(),
                                                           "exp_avg-0_9.tensor.swp")
    gone = 4_000_000  # above the default pid_max: no such process
    here = socket.gethostname()
    dead = {kind: f".{kind}.{gone}@{here}@0_9.tensor.swp" for kind in ("tmp", "loading", "other")}
    for each in list(dead.values()) + [hidden_name("0_9.tensor.swp", "tmp"), "0_9.tensor.swp",
                                       f".tmp.{gone}@{here}", f".tmp.x{gone}@{here}@0_9.tensor.swp"]:
        (tmp_path / each).write_bytes(b"x")
    removed = remove_hidden_files_of_dead_processes(str(tmp_path), ("tmp", "loading"))
    assert sorted(removed) == sorted(str(tmp_path / dead[kind]) for kind in ("tmp", "loading"))
    assert len(os.listdir(tmp_path)) == 5


def test_in_a_folder_this_process_holds_every_other_processs_hidden_files_go(tmp_path):
    """Regression test (helper-155's review): a container restarted with a fresh pid namespace gives its processes
    the killed run's process ids (pid 1, low numbers), so that run's files were taken for a live process's at every
    start, and kept for good (whole swap files). Where this process holds the folder's lock no other process can
    use it: every other process's hidden file goes, alive or not, of this host or another; its own stay."""
    import socket

    from tencache_ds.io.stale_files import hidden_name, remove_hidden_files_of_dead_processes
    here = socket.gethostname()
    alive = os.getppid()  # a live process other than this one
    others = [f".tmp.{alive}@{here}@0_9.tensor.swp", f".loading.1@{here}@0_9.tensor.swp",
              f".tmp.{alive}@elsewhere@1_9.tensor.swp"]
    own = hidden_name("0_9.tensor.swp", "tmp")
    for name in others + [own]:
        (tmp_path / name).write_bytes(b"x")
    assert remove_hidden_files_of_dead_processes(str(tmp_path), ("tmp", "loading")) == []  # not held: kept
    removed = remove_hidden_files_of_dead_processes(str(tmp_path), ("tmp", "loading"), held=True)
    assert sorted(removed) == sorted(str(tmp_path / name) for name in others)
    assert os.listdir(tmp_path) == [own]


def test_a_folder_is_locked_only_where_its_lock_was_taken(tmp_path):
    from tencache_ds.io import folder_lock
    key = folder_lock.hold(str(tmp_path / "swap"))
    try:
        assert folder_lock.locked(key)
    finally:
        folder_lock.let_go(key)
    assert not folder_lock.locked(key)
