"""Stale build locks in torch's extension cache (tencache_ds/ext_lock.py): real lock files in a throw-away
TORCH_EXTENSIONS_DIR, real processes holding torch's FileBaton or working in the build folder, real kills."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tencache_ds import ext_lock
from tencache_ds.errors import TencacheResourceError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A builder as torch runs one: FileBaton creates the lock and keeps its descriptor until release(). The lock path
# comes through the environment, not argv, so that only the open descriptor (rule 1) can make it look in use.
# With SPAWN_COMPILER=1 it also starts a stand-in compiler the way ninja does: cwd = the build folder, in a process
# group of its own, and prints its pid.
HOLD_BATON = ("import os, subprocess, sys\n"
              "from torch.utils.file_baton import FileBaton\n"
              "baton = FileBaton(os.environ['LOCK_PATH'])\n"
              "assert baton.try_acquire()\n"
              "if os.environ.get('SPAWN_COMPILER'):\n"
              "    compiler = subprocess.Popen(['sleep', '60'], cwd=os.path.dirname(os.environ['LOCK_PATH']),\n"
              "                                process_group=0)\n"
              "    print(compiler.pid, flush=True)\n"
              "print('held', flush=True)\n"
              "sys.stdin.read()\n"
              "baton.release()\n")


def make_abandoned_lock(root, op="async_io"):
    """An op build folder whose builder died mid-build: sources written, lock created with O_EXCL and closed."""
    build_dir = root / op
    build_dir.mkdir(parents=True)
    (build_dir / "build.ninja").write_text("# written by torch before ninja runs\n")
    os.close(os.open(build_dir / ext_lock.LOCK_NAME, os.O_CREAT | os.O_EXCL))
    return str(build_dir / ext_lock.LOCK_NAME)


def start_baton_holder(lock_path, new_session=False, spawn_compiler=False):
    env = dict(os.environ, LOCK_PATH=lock_path, SPAWN_COMPILER="1" if spawn_compiler else "")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_BATON], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT, start_new_session=new_session)
    holder.compiler_pid = int(holder.stdout.readline()) if spawn_compiler else None
    assert holder.stdout.readline().strip() == "held"
    return holder


def is_running(pid):
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def kill(process):
    process.kill()
    process.wait(timeout=30)


def test_an_abandoned_lock_is_reported_with_its_path_and_remedy(tmp_path, monkeypatch):
    """Scenario: a build was killed and left its lock; the finder, and the start-up check, name it."""
    # Step 1: the lock of a dead build, in the extensions root TORCH_EXTENSIONS_DIR names.
    root = tmp_path / "torch_extensions"
    lock = make_abandoned_lock(root)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    assert ext_lock.extensions_root() == str(root)
    # Step 2: the finder reports it, with the op it blocks and the exact command that fixes it.
    stale = ext_lock.find_stale_locks()
    assert [(found.path, found.op) for found in stale] == [(lock, "async_io")]
    assert stale[0].remedy == f"rm {lock}"
    assert lock in stale[0].describe() and f"rm {lock}" in stale[0].describe()
    # Step 3: the start-up check turns the silent wait into an error naming the path and the remedy.
    with pytest.raises(TencacheResourceError) as raised:
        ext_lock.raise_if_stale_locks()
    assert lock in str(raised.value) and f"rm {lock}" in str(raised.value)
    # Step 4: a run that loads only other ops is not stopped by it; after the remedy nothing is reported.
    ext_lock.raise_if_stale_locks(ops=["cpu_adam"])
    os.remove(lock)
    assert ext_lock.find_stale_locks() == []
    ext_lock.raise_if_stale_locks()


def test_a_lock_held_by_a_live_filebaton_is_not_stale_until_its_holder_is_killed(tmp_path):
    """Scenario: another process is building (it holds torch's FileBaton); then it is killed mid-build."""
    root = tmp_path / "torch_extensions"
    (root / "cpu_adam").mkdir(parents=True)
    lock = str(root / "cpu_adam" / ext_lock.LOCK_NAME)
    # Step 1: while the holder lives, the lock is in use: not reported, no error.
    holder = start_baton_holder(lock)
    try:
        assert ext_lock.find_stale_locks(root) == []
        ext_lock.raise_if_stale_locks(root=str(root))
    finally:
        kill(holder)
    # Step 2: killed, it never releases the baton: the same lock is now stale.
    assert os.path.exists(lock)
    assert [found.path for found in ext_lock.find_stale_locks(root)] == [lock]
    with pytest.raises(TencacheResourceError, match="cpu_adam"):
        ext_lock.raise_if_stale_locks(root=str(root))


def test_a_compiler_still_working_in_the_build_folder_keeps_the_lock_live(tmp_path):
    """Scenario: the Python process that took the lock is gone, but a compiler it started (cwd = the build
    folder, as ninja runs them) still writes there: removing the lock now would let a second build clobber it."""
    root = tmp_path / "torch_extensions"
    lock = make_abandoned_lock(root)
    compiler = subprocess.Popen(["sleep", "60"], cwd=os.path.dirname(lock))
    try:
        assert ext_lock.find_stale_locks(root) == []
    finally:
        kill(compiler)
    assert [found.path for found in ext_lock.find_stale_locks(root)] == [lock]


def test_without_proc_only_a_long_quiet_lock_is_called_stale(tmp_path, monkeypatch):
    """Scenario: no process can be inspected (no /proc, as on macOS): a fresh lock may belong to a build we cannot
    see, so only one whose build folder has not changed for QUIET_S is reported."""
    root = tmp_path / "torch_extensions"
    lock = make_abandoned_lock(root)
    monkeypatch.setattr(ext_lock, "PROC", str(tmp_path / "no-proc-here"))
    assert ext_lock.find_stale_locks(root) == []
    old = time.time() - ext_lock.QUIET_S - 60
    for path in (lock, os.path.join(os.path.dirname(lock), "build.ninja"), os.path.dirname(lock)):
        os.utime(path, (old, old))
    stale = ext_lock.find_stale_locks(root)
    assert [found.path for found in stale] == [lock] and "could not be inspected" in stale[0].rule


def test_a_killed_sessions_locks_are_found_and_removed_and_no_member_survives(tmp_path):
    """Scenario (what doctor does on a probe timeout): find the locks a session builds under, kill the whole
    session (a compiler in a process group of its own included, as ninja starts them), remove them; a lock
    somebody else holds is never removed."""
    root = tmp_path / "torch_extensions"
    (root / "async_io").mkdir(parents=True)
    (root / "cpu_adam").mkdir(parents=True)
    ours, theirs = (str(root / op / ext_lock.LOCK_NAME) for op in ("async_io", "cpu_adam"))
    builder = start_baton_holder(ours, new_session=True, spawn_compiler=True)
    assert os.getpgid(builder.compiler_pid) != os.getpgid(builder.pid)  # out of reach of killpg(builder)
    other = start_baton_holder(theirs)
    try:
        # Step 1: only the session's own lock is attributed to it.
        assert ext_lock.locks_used_by_session(builder.pid, [ours, theirs]) == [ours]
        # Step 2: kill the session; its lock goes, the other one (still held) stays.
        assert ext_lock.kill_session(builder.pid) == 0
        builder.wait(timeout=30)
        assert ext_lock.remove_abandoned_locks([ours, theirs], wait_s=0.5) == ([ours], [theirs])
        assert not os.path.exists(ours) and os.path.exists(theirs)
        assert not is_running(builder.compiler_pid)
    finally:
        kill(other)
        if is_running(builder.compiler_pid):
            os.kill(builder.compiler_pid, signal.SIGKILL)


def test_extensions_root_is_where_torch_builds():
    """Without TORCH_EXTENSIONS_DIR the root is computed without importing torch; it must be the folder torch's
    own _get_build_directory picks (py<XY>_<accelerator> under the user cache dir)."""
    code = ("import os\n"
            "from tencache_ds import ext_lock\n"
            "mine = ext_lock.extensions_root()\n"
            "import torch.utils.cpp_extension as cpp\n"
            "print(mine == os.path.realpath(os.path.dirname(cpp._get_build_directory('some_op', False))), mine)\n")
    env = {key: value for key, value in os.environ.items() if key != "TORCH_EXTENSIONS_DIR"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "True", result.stdout
