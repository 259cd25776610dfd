"""io/folder_lock.py: one process per swap folder. Another process's hold is refused, naming it; the kernel lets a
lock go when its process dies, however; within a process the hold is counted; a forked child keeps none; the lock
file is beside the folder, so emptying the folder leaves it."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tencache_ds.io import folder_lock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOLDER = """
import sys, time
from tencache_ds.io import folder_lock
folder_lock.hold(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def other_process_holding(tmp_path):
    folder = str(tmp_path / "zero_stage_3" / "optimizer" / "rank0")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, folder], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield folder, proc
    finally:
        proc.kill()
        proc.wait()


def test_another_process_is_refused_naming_the_holder_until_it_dies(other_process_holding):
    folder, proc = other_process_holding
    with pytest.raises(folder_lock.FolderInUse, match=rf"pid {proc.pid} on "):
        folder_lock.hold(folder)
    assert folder not in folder_lock.held_folders()
    proc.send_signal(signal.SIGKILL)  # no cleanup of its own: the kernel lets the lock go
    proc.wait()
    key = folder_lock.hold(folder)
    assert folder_lock.held_folders() == [key] == [os.path.realpath(folder)]
    folder_lock.let_go(key)
    assert folder_lock.held_folders() == []


def test_a_process_holds_a_folder_as_often_as_its_swappers_do(tmp_path):
    folder = str(tmp_path / "rank0")
    key = folder_lock.hold(folder)
    assert folder_lock.hold(folder) == key  # a second engine in the same folder
    folder_lock.let_go(key)
    assert folder_lock.held_folders() == [key]
    folder_lock.let_go(key)
    assert folder_lock.held_folders() == []
    folder_lock.let_go(key)  # not held: nothing to do


def test_a_forked_child_does_not_keep_the_folder_after_this_process_lets_it_go(tmp_path):
    """A lock belongs to the open file, which a fork shares: a data loader's worker forked while the folder was held
    would hold it after the trainer let it go, and refuse the trainer's next engine (its own pid named)."""
    folder = str(tmp_path / "rank0")
    key = folder_lock.hold(folder)
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # the worker, after the fork handlers: says so, then sleeps through the parent's let_go and hold
        os.write(ready_w, b"1")
        time.sleep(3)
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        folder_lock.let_go(key)
        assert folder_lock.hold(folder) == key
        folder_lock.let_go(key)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(ready_r)
        os.close(ready_w)


def test_the_lock_file_is_beside_the_folder_which_a_run_empties(tmp_path):
    folder = tmp_path / "rank0"
    key = folder_lock.hold(str(folder))
    try:
        folder.mkdir()
        (folder / "0_param.tensor.swp").write_bytes(b"\0" * 4096)
        shutil.rmtree(folder)
        assert os.path.exists(folder_lock.lock_path(str(folder)))
        assert not os.path.exists(folder)
    finally:
        folder_lock.let_go(key)
