"""Stale build locks in torch's extension cache. Owns: where that cache is, which `lock` files in it are left over
from a killed build, and removing the ones a caller proves it abandoned. Does not own: building ops (DeepSpeed
and torch.utils.cpp_extension do that) or deciding when to check (doctor, setup.sh, the swappers).

Why this exists: DeepSpeed JIT-builds its ops (async_io, cpu_adam, ...) with torch.utils.cpp_extension.load, which
takes a `lock` file in the op's build folder (torch.utils.file_baton.FileBaton: create with O_EXCL, keep the
descriptor open, close and delete it when the build ends). A builder killed mid-build (a timed-out `tencache-ds
doctor` probe, Ctrl-C on a first training run, the OOM killer) never deletes it, and every later process that loads
the op waits on it forever (FileBaton.wait polls os.path.exists, with no timeout and no message).

Where the cache is, as torch computes it (cpp_extension._get_build_directory): $TORCH_EXTENSIONS_DIR/<op> when
that variable is set, else <user cache dir>/torch_extensions/py<XY><abiflags>_<cpu|cuXYZ|rocmXYZ>/<op>, the user
cache dir being $XDG_CACHE_HOME or ~/.cache. Torch is not imported for this: its version.py is read as text.

The staleness rule. A lock is *in use* when a process visible in /proc
  1. holds the lock file open (the FileBaton owner does, from creation to release), or
  2. has its working directory inside the build folder (torch runs ninja with cwd=<build folder>; the compilers
     ninja starts inherit it), or
  3. names the build folder on its command line;
and *stale* when it is not in use and every process that could have built there was inspected: the processes of
the lock file's owner (uid), whose /proc/<pid>/fd and cwd we must be able to read. When some of them cannot be read
because they belong to another user (a shared cache, looked at without root) or there is no /proc at all, a lock
with no visible builder is called stale only after nothing in its build folder changed for QUIET_S. A process of our
own uid that /proc still refuses is non-dumpable or more privileged than us (a VM's or container's init, a setuid
program): not a compiler, ninja or a Python build, so it does not hold the decision back.

Limits. Builders in another PID namespace (a second container sharing the cache folder) are invisible: share the
cache only between processes that see each other, or give each container its own TORCH_EXTENSIONS_DIR. Rules 2 and
3 err on the side of "in use": a shell sitting in the build folder hides a stale lock rather than exposing a live
one to `rm`.
"""
import ast
import dataclasses
import importlib.util
import os
import shlex
import signal
import sys
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .errors import TencacheResourceError

LOCK_NAME = "lock"        # torch.utils.cpp_extension: FileBaton(os.path.join(build_directory, 'lock'))
QUIET_S = 1800.0          # fallback only; a single nvcc compile for many GPU archs can run for many minutes
PROC = "/proc"


# ----------------------------------------------------------------------------------------------------------------
# Where the cache is
# ----------------------------------------------------------------------------------------------------------------
def _torch_accelerator_tag() -> str:
    """'cpu', 'cuXYZ' or 'rocmXYZ', as _get_build_directory derives it from torch.version (hip wins over cuda)."""
    version = getattr(sys.modules.get("torch"), "version", None)
    if version is not None:
        values = {"hip": getattr(version, "hip", None), "cuda": getattr(version, "cuda", None)}
    else:
        values = _read_torch_version_file()
    if values.get("hip"):
        return "rocm" + str(values["hip"]).replace(".", "")
    if values.get("cuda"):
        return "cu" + str(values["cuda"]).replace(".", "")
    return "cpu"


def _read_torch_version_file() -> Dict[str, Optional[str]]:
    """{'cuda': ..., 'hip': ...} from torch/version.py without importing torch (that takes seconds)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return {}
    if spec is None or not spec.submodule_search_locations:
        return {}
    values: Dict[str, Optional[str]] = {}
    try:
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError):
        return {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id in ("cuda", "hip") and isinstance(node.value, ast.Constant):
            values[target.id] = node.value.value
    return values


def extensions_root(environ: Optional[Dict[str, str]] = None) -> str:
    """The folder holding one build folder per op, for this interpreter and torch build (may not exist yet)."""
    environ = os.environ if environ is None else environ
    if environ.get("TORCH_EXTENSIONS_DIR") is not None:
        return os.path.realpath(environ["TORCH_EXTENSIONS_DIR"])
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    python_tag = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return os.path.realpath(os.path.join(cache, "torch_extensions", f"{python_tag}_{_torch_accelerator_tag()}"))


def find_locks(root: Optional[str] = None, ops: Optional[Iterable[str]] = None) -> List[str]:
    """Every `lock` file directly inside an op build folder of ``root`` (default: extensions_root()), live or not;
    only the folders named in ``ops`` when given. Cheap: one listdir plus one lstat per op, no /proc scan."""
    root = os.path.realpath(root) if root is not None else extensions_root()
    try:
        names = sorted(os.listdir(root)) if ops is None else sorted(set(ops))
    except OSError:  # no cache yet: nothing was ever built, so nothing can be locked
        return []
    return [os.path.join(root, name, LOCK_NAME) for name in names
            if os.path.lexists(os.path.join(root, name, LOCK_NAME))]


# ----------------------------------------------------------------------------------------------------------------
# Who is building: a snapshot of /proc
# ----------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Process:
    pid: int
    pgrp: int
    sid: int   # session id: ninja starts each compiler in a process group of its own, but in the same session
    uid: int
    cwd: Optional[str]
    open_files: Tuple[str, ...]
    cmdline: Tuple[str, ...]
    inspected: bool  # False when /proc refused its fd table or cwd (another user's process, seen without root)


def _read_process(pid: int) -> Optional[_Process]:
    """One process, or None when it is gone or a zombie (a zombie holds no files and has no cwd)."""
    base = os.path.join(PROC, str(pid))
    try:
        uid = os.stat(base).st_uid
        with open(os.path.join(base, "stat")) as handle:
            stat = handle.read()
        with open(os.path.join(base, "cmdline"), "rb") as handle:
            cmdline = tuple(arg.decode(errors="replace") for arg in handle.read().split(b"\0") if arg)
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the command name in parentheses may contain spaces
    if not fields or fields[0] in ("Z", "X"):
        return None
    inspected, cwd, open_files = True, None, []
    try:
        cwd = os.readlink(os.path.join(base, "cwd"))
        fd_dir = os.path.join(base, "fd")
        for fd in os.listdir(fd_dir):
            try:
                open_files.append(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:  # closed between listdir and readlink
                continue
    except PermissionError:
        inspected = False
    except OSError:
        return None  # exited while we looked
    return _Process(pid, int(fields[2]), int(fields[3]), uid, cwd, tuple(open_files), cmdline, inspected)


def _processes() -> Optional[List[_Process]]:
    """Every process in this PID namespace, or None without a readable /proc (not Linux)."""
    try:
        pids = [int(name) for name in os.listdir(PROC) if name.isdigit()]
    except OSError:
        return None
    return [process for process in map(_read_process, pids) if process is not None]


def _builders(lock_path: str, processes: Sequence[_Process]) -> List[str]:
    """Why ``lock_path`` is in use (rules 1-3 of the module docstring): one phrase per live builder; [] if none."""
    build_dir = os.path.dirname(lock_path)
    inside = build_dir.rstrip(os.sep) + os.sep
    reasons = []
    for process in processes:
        if lock_path in process.open_files:
            reasons.append(f"pid {process.pid} holds it open")
        elif process.cwd is not None and (process.cwd == build_dir or process.cwd.startswith(inside)):
            reasons.append(f"pid {process.pid} ({_command_name(process)}) works in the build folder")
        elif any(arg == build_dir or inside in arg or arg.endswith(build_dir) for arg in process.cmdline):
            reasons.append(f"pid {process.pid} ({_command_name(process)}) names the build folder")
    return reasons


def _command_name(process: _Process) -> str:
    return os.path.basename(process.cmdline[0]) if process.cmdline else "?"


# ----------------------------------------------------------------------------------------------------------------
# Stale locks
# ----------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StaleLock:
    """A `lock` file nobody will ever delete. ``rule`` says which part of the staleness rule decided it."""

    path: str
    op: str          # the build folder's name: the op whose load() would wait on this lock
    age_s: float     # since the lock was created
    quiet_s: float   # since anything in the build folder last changed
    rule: str

    @property
    def remedy(self) -> str:
        return f"rm {shlex.quote(self.path)}"

    def describe(self) -> str:
        return (f"{self.path} (the {self.op} op's build lock, {_fmt_age(self.age_s)} old; {self.rule}): every "
                f"process that loads {self.op} waits on it forever, silently; remedy: {self.remedy}")


def _fmt_age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _quiet_s(build_dir: str, now: float) -> float:
    """Seconds since the newest change among the build folder and the files directly in it."""
    newest = 0.0
    try:
        newest = os.lstat(build_dir).st_mtime
        with os.scandir(build_dir) as entries:
            for entry in entries:
                try:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                except OSError:
                    continue
    except OSError:
        pass
    return max(0.0, now - newest)


def find_stale_locks(root: Optional[str] = None, ops: Optional[Iterable[str]] = None,
                     quiet_s: float = QUIET_S) -> List[StaleLock]:
    """The stale locks under ``root`` (default: extensions_root()), by the rule in the module docstring; only the
    build folders named in ``ops`` when given. Reads /proc only when some lock exists."""
    locks = find_locks(root, ops)
    if not locks:
        return []
    before = {path: _identity(path) for path in locks}
    processes = _processes()
    stale = []
    now = time.time()
    for path in locks:
        if before[path] is None:
            continue
        owner_uid, _, mtime = before[path]
        quiet = _quiet_s(os.path.dirname(path), now)
        if processes is None:
            uninspected = ["no readable /proc"]
        else:
            if _builders(path, processes):
                continue
            uninspected = [str(p.pid) for p in processes
                           if not p.inspected and p.uid == owner_uid and p.uid != os.geteuid()]
        if not uninspected:
            rule = "no process holds it open or works in its build folder"
        elif quiet >= quiet_s:
            rule = (f"no visible builder and nothing in its build folder changed for {_fmt_age(quiet)} (some "
                    f"processes could not be inspected: {', '.join(uninspected[:5])})")
        else:
            continue  # an invisible process may still be building: not provably stale yet
        # FileBaton.release closes the descriptor, then deletes the file: a lock released while we looked is gone
        # or (re-created by the next builder) another file now.
        if _identity(path) != before[path]:
            continue
        stale.append(StaleLock(path, os.path.basename(os.path.dirname(path)), max(0.0, now - mtime), quiet, rule))
    return stale


def _identity(path: str) -> Optional[Tuple[int, Tuple[int, int], float]]:
    """(owner uid, (device, inode), mtime) of ``path``, or None when it is gone."""
    try:
        stat = os.lstat(path)
    except OSError:
        return None
    return stat.st_uid, (stat.st_dev, stat.st_ino), stat.st_mtime


def raise_if_stale_locks(ops: Optional[Iterable[str]] = None, root: Optional[str] = None) -> None:
    """Turn the silent forever-wait on a stale build lock into an error. Call it before loading a DeepSpeed op (the
    swappers: ops=("async_io",)); ``ops`` limits the check to the build folders of the ops about to be loaded.

    Raises TencacheResourceError naming every stale lock path and the command that removes it."""
    stale = find_stale_locks(root, ops)
    if not stale:
        return
    lines = "\n".join(f"  - {lock.describe()}" for lock in stale)
    raise TencacheResourceError(
        f"{len(stale)} stale torch extension build lock(s), left by a killed build:\n{lines}\n"
        f"Remove them (`{'; '.join(lock.remedy for lock in stale)}`), or run `tencache-ds doctor`, which lists "
        "every one.")


# ----------------------------------------------------------------------------------------------------------------
# Cleaning up after a builder we killed (doctor's probe)
# ----------------------------------------------------------------------------------------------------------------
def locks_used_by_session(sid: int, locks: Iterable[str]) -> List[str]:
    """Of ``locks``, those a process of session ``sid`` holds open or builds for (rules 1-3)."""
    processes = [process for process in (_processes() or []) if process.sid == sid]
    return [path for path in locks if _builders(path, processes)]


def kill_session(sid: int, wait_s: float = 5.0) -> int:
    """SIGKILL every process of session ``sid`` until none is left (or ``wait_s`` passed); returns how many are left.

    Killing the process group of a builder is not enough: ninja puts each compiler in a process group of its own
    (so that Ctrl-C reaches ninja only), and those compilers would go on writing in the build folder, orphaned.
    They all stay in the builder's session, though, unless one calls setsid(), which neither ninja nor gcc does."""
    deadline = time.monotonic() + wait_s
    while True:
        members = [process.pid for process in (_processes() or []) if process.sid == sid and
                   process.pid != os.getpid()]
        if not members or time.monotonic() >= deadline:
            return len(members)
        for pid in members:  # repeated, since a member may have forked between the snapshot and the kill
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        time.sleep(0.02)


def remove_abandoned_locks(locks: Iterable[str], wait_s: float = 5.0) -> Tuple[List[str], List[str]]:
    """Delete each of ``locks`` (ones the caller's killed builder created) as soon as no process is in use of it,
    waiting up to ``wait_s`` for killed compilers to exit. Returns (removed, still in use: kept)."""
    pending = list(locks)
    removed: List[str] = []
    deadline = time.monotonic() + wait_s
    while pending:
        processes = _processes() or []
        for path in list(pending):
            if not os.path.lexists(path):
                pending.remove(path)
            elif not _builders(path, processes):
                try:
                    os.remove(path)
                    removed.append(path)
                except FileNotFoundError:
                    pass
                pending.remove(path)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return removed, pending
