"""Files shared between a swap folder and checkpoints by hard links. Owns: putting a file's bytes under a second
name without copying them where the file system allows (``place``), and the rule that keeps a checkpoint unchanged
afterwards: a file with more than one name is never written in place (``LinkSafeIO``).

A hard link is one inode under two names, so a write through either name would change both: a swap file written
after a save would change the checkpoint. Every write to a swap file goes through ``LinkSafeIO``, which first gives
the swap folder's name a file of its own when the inode has other names: a write of the whole file (what the tiers
write) starts a new file, for free; a partial write copies the file first. The check is ``st_nlink``, so it also
covers links made by another process (a previous run whose checkpoint shares this swap folder's files).

Names are always replaced by a rename (``os.replace``) of a finished temporary file: a reader sees the old file or
the new one, never a half-written one, and the old inode, if a checkpoint still names it, is not touched.
"""
import errno
import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Callable, Optional

from ..units import fmt_bytes
from .stale_files import hidden_name

# link() failed because this file system or this pair of folders cannot share an inode: copy instead
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES}


@dataclass
class Placed:
    """What ``place`` did: ``linked`` (no bytes written), or ``bytes_written`` bytes copied."""
    linked: bool
    bytes_written: int


def place(source: str, target: str, fill=None) -> Placed:
    """Give ``target`` the bytes of file ``source``: a hard link when both are on one file system, else a copy
    (``fill(handle)`` writes the bytes instead of reading ``source``, e.g. from memory that holds them; the file is
    then padded to ``source``'s size). ``target`` is replaced atomically; if it already is ``source``'s inode,
    nothing happens."""
    try:
        if os.path.samefile(source, target):
            return Placed(linked=True, bytes_written=0)
    except FileNotFoundError:
        pass
    temporary = _temporary_name(target)
    try:
        try:
            os.link(source, temporary)
            placed = Placed(linked=True, bytes_written=0)
        except OSError as err:
            if err.errno not in _NO_LINK:
                raise
            placed = Placed(linked=False, bytes_written=_copy(source, temporary, fill))
        os.replace(temporary, target)
        return placed
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def is_shared(path: str) -> bool:
    """Has ``path``'s inode other names (a checkpoint's)? A write to it then has to make it a file of its own."""
    try:
        return os.stat(path).st_nlink > 1
    except FileNotFoundError:
        return False


def room_to_write_again(folder: str, shared_bytes: int) -> Optional[str]:
    """After ``shared_bytes`` of ``folder``'s files were linked into a checkpoint: a warning where ``folder``'s file
    system has less free than that, else None. Training on writes each of those files again as a new file beside the
    checkpoint's (``give_own_file``), so it takes up to that much more room, which comes back only when the checkpoint
    is removed; a write that finds none stops the step ("no space left", io/direct_io.py). Stock's save, a copy of
    the folder, needs the same room at the save itself. Each rank says so of its own folder's files: ranks sharing a
    file system can together need more than any one of them sees. None where the room cannot be read (advice only:
    the save goes on)."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if shared_bytes <= free:
        return None
    return (f"the checkpoint shares {fmt_bytes(shared_bytes)} of swap files with {folder}; training on writes them "
            f"again as new files beside the checkpoint's as they change, and that file system has {fmt_bytes(free)} "
            f"free: a later step or save may stop with \"no space left\". Free space there, remove older checkpoints, "
            f"or save checkpoints on another file system (the swap files are then copied into them)")


def give_own_file(path: str, whole: bool) -> bool:
    """Before a write to ``path``: if its inode has other names (a checkpoint), make ``path`` a file of its own, so
    that the write changes only it. ``whole``: the write replaces every byte (the old ones need not be kept).
    Returns True if the link was broken."""
    if not is_shared(path):
        return False
    if whole:
        os.unlink(path)  # the write creates a new file; the other names keep the old inode
        return True
    temporary = _temporary_name(path)
    try:
        shutil.copyfile(path, temporary)
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
    return True


def make_own_file(path: str) -> bool:
    """Before writes that together replace every byte of ``path``: if its inode has other names (a checkpoint), make
    ``path`` a new file of the same size (zeros until written), so that the writes change only it and nothing is
    copied. Returns True if the link was broken."""
    if not is_shared(path):
        return False
    size = os.path.getsize(path)
    temporary = _temporary_name(path)
    try:
        with open(temporary, "wb") as handle:
            handle.truncate(size)
        os.replace(temporary, path)  # the other names keep the old inode
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
    return True


def unshare_folder(folder: str, owned: Callable[[str], bool] = lambda name: True) -> int:
    """Remove from ``folder`` every file that has other names (the others keep it) and that ``owned`` says is the
    caller's: for a swap folder nobody will read again, so that a later writer that is not ``LinkSafeIO`` (stock
    DeepSpeed's aio opens existing swap files and writes them in place) cannot reach a checkpoint through it.
    Returns how many names were removed."""
    removed = 0
    for entry in os.scandir(folder) if os.path.isdir(folder) else ():
        if entry.is_file(follow_symlinks=False) and owned(entry.name) and \
                entry.stat(follow_symlinks=False).st_nlink > 1:
            os.unlink(entry.path)
            removed += 1
    return removed


class LinkSafeIO:
    """An I/O engine (io/direct_io.py's interface) whose writes never change a file that has other names."""

    def __init__(self, io):
        self._io = io
        self.links_broken = 0

    def write(self, tensor, path: str, nbytes: int = None, file_offset: int = 0):
        length = tensor.numel() * tensor.element_size() if nbytes is None else nbytes
        whole = file_offset == 0 and (not os.path.exists(path) or length >= os.path.getsize(path))
        if give_own_file(path, whole):
            self.links_broken += 1
        return self._io.write(tensor, path, nbytes=nbytes, file_offset=file_offset)

    def __getattr__(self, name):
        return getattr(self._io, name)


TEMPORARY_KIND = "tmp"  # the ``hidden_name`` kind of the files below before their rename: a start sweeps them


def _temporary_name(target: str) -> str:
    # (the random part: two threads of one process may copy the same file)
    return os.path.join(os.path.dirname(target) or ".",
                        hidden_name(f"{uuid.uuid4().hex[:8]}.{os.path.basename(target)}", TEMPORARY_KIND))


def _copy(source: str, target: str, fill) -> int:
    size = os.path.getsize(source)
    try:
        if fill is None:
            shutil.copyfile(source, target)
            return os.path.getsize(target)
        with open(target, "wb") as handle:
            fill(handle)
            handle.truncate(size)  # the aligned tail the file has (zeros past the tensor)
        return size
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # (a bare "No space left on device" named neither folder nor file: helper-243's review)
        folder = os.path.dirname(target) or "."
        free = shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
        raise OSError(err.errno, f"{os.strerror(err.errno)}: {folder} while copying {os.path.basename(source)} "
                                 f"({fmt_bytes(size)}) there from {os.path.dirname(source)}, {fmt_bytes(free)} free; "
                                 f"free space there or save elsewhere") from err
