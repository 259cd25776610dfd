"""One process per swap folder. Owns: an exclusive lock on a swap folder, held by this process while any of its
swappers uses the folder (``hold``, ``let_go``), and who holds it when another process asks (``FolderInUse``).

Why: two runs given the same nvme_path (two experiments of a sweep launched with one config) use the same rank
folders and the same file names. The second run's start empties the folder under the first (stock DeepSpeed and
tencache alike), and then one of them stops on a missing swap file, or reads the other's bytes and trains on them
without a word. Now the second run stops at its start, before it removes or writes anything in the folder, naming
the folder and the process that holds it.

How: ``fcntl.flock`` on a file beside the folder (``<folder>.lock``: not inside it, since a run empties its folder),
which the kernel lets go when the process ends, however it ends: no lock outlives its run, and none is ever removed
by hand (a lock file unlinked while another process opens it would give two holders). Within a process the lock is
counted, since its swappers share folders (several engines, zero.Init models of one engine).
"""
import fcntl
import os
import socket
import threading
from typing import Dict, List

_held: Dict[str, List[int]] = {}  # the folder's real path -> [descriptor of its lock file, swappers holding it]
_guard = threading.Lock()


class FolderInUse(OSError):
    """Another process holds ``folder``; ``holder`` is what it wrote in the lock file (its pid and host)."""

    def __init__(self, folder: str, holder: str):
        super().__init__(f"{folder} is in use by another process ({holder or 'pid unknown'})")
        self.folder, self.holder = folder, holder


def lock_path(folder: str) -> str:
    return os.path.realpath(folder) + ".lock"


def hold(folder: str) -> None:
    """Hold ``folder`` for this process (once more, if it does already). Raises FolderInUse if another process holds
    it, OSError if its parent cannot hold a lock file."""
    key = os.path.realpath(folder)
    with _guard:
        if key in _held:
            _held[key][1] += 1
            return
        os.makedirs(os.path.dirname(key), exist_ok=True)
        fd = os.open(lock_path(folder), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
            os.close(fd)
            raise FolderInUse(key, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        _held[key] = [fd, 1]


def let_go(folder: str) -> None:
    """One swapper less holds ``folder``; the last one lets the lock go. A folder not held is left alone."""
    key = os.path.realpath(folder)
    with _guard:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _held[key]
            os.close(entry[0])  # closing the descriptor lets the lock go; the file stays (see above)


def held_folders() -> List[str]:
    with _guard:
        return sorted(_held)
