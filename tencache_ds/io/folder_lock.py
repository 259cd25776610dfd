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
counted, since its swappers share folders (several engines, zero.Init models of one engine). A forked child (a data
loader's worker) closes its inherited copy of the descriptor at once: a lock belongs to the open file, so a child
that kept it would hold the folder after this process let it go, and refuse this process's next engine. Where the
file system has no ``flock`` (some FUSE and Lustre mounts), the run goes on unlocked, said once in the log. On NFS
the lock is one of the server's: a crashed node's holds until its lease expires (about 90 s).
"""
import errno
import fcntl
import os
import socket
import threading
from typing import Dict, List, Optional

from ..log import logger

_held: Dict[str, List] = {}  # the folder's real path -> [descriptor of its lock file (None: unlocked), holders]
# reentrant: a parameter swapper's finalizer (garbage collection, at any allocation) may let go inside hold()
_guard = threading.RLock()
_NO_FLOCK = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}


class FolderInUse(OSError):
    """Another process holds ``folder``; ``holder`` is what it wrote in the lock file (its pid and host)."""

    def __init__(self, folder: str, holder: str):
        super().__init__(f"{folder} is in use by another process ({holder or 'pid unknown'})")
        self.folder, self.holder = folder, holder


def lock_path(folder: str) -> str:
    return os.path.realpath(folder) + ".lock"


def hold(folder: str) -> str:
    """Hold ``folder`` for this process (once more, if it does already); returns the key ``let_go`` takes. Raises
    FolderInUse if another process holds it, OSError if its parent cannot hold a lock file."""
    key = os.path.realpath(folder)
    with _guard:
        if key in _held:
            _held[key][1] += 1
            return key
        os.makedirs(os.path.dirname(key), exist_ok=True)
        _held[key] = [_locked_descriptor(key), 1]
        return key


def let_go(key: str) -> None:
    """One swapper less holds the folder ``hold`` returned ``key`` for; the last one lets the lock go."""
    with _guard:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _held[key]
            if entry[0] is not None:
                os.close(entry[0])  # closing the descriptor lets the lock go; the file stays (see above)


def locked(key: str) -> bool:
    """Does this process hold ``hold``'s lock on the folder of ``key`` (not where its file system cannot lock)?"""
    with _guard:
        entry = _held.get(key)
        return entry is not None and entry[0] is not None


def held_folders() -> List[str]:
    with _guard:
        return sorted(_held)


def _locked_descriptor(key: str) -> Optional[int]:
    path = lock_path(key)
    try:
        fd, writable = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644), True
    except PermissionError:  # another user's lock file: reading is enough to lock it
        fd, writable = os.open(path, os.O_RDONLY | os.O_CLOEXEC), False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        return fd
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
        os.close(fd)
        raise FolderInUse(key, holder) from None
    except OSError as err:
        os.close(fd)
        if err.errno not in _NO_FLOCK:
            raise
        logger.warning("%s: this file system cannot lock it (%s): nothing stops another run from using the same "
                       "swap folder", key, err.strerror or err)
        return None


def _forget_in_child() -> None:
    """In a forked child: close the inherited descriptors (the parent's locks stay the parent's)."""
    global _guard
    _guard = threading.RLock()  # the parent's may have been taken at the fork
    for fd, _holders in _held.values():
        if fd is not None:
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)
