"""Files a process killed before its cleanup left behind. Owns: reading the process id a file name carries, telling
whether that process is gone, and removing such files, also where another host made them; and one name for the
hidden files a process makes beside others until it renames or removes them (``hidden_name``: a swap folder's
temporary copies and the checkpoint files a load stages there), which a later start sweeps. Does not own: how other
writers name their files (io/drive_rate.py's trial files, io/save_from_files.py's temporary checkpoint files,
checkpoint-for-cpu's ZeRO files being filled), which it is told.

Plain module: imports nothing of torch or DeepSpeed.
"""
import os
import re
import socket
import time
from typing import Callable, Iterable, List, Optional, Tuple

MAX_PID = 1 << 22  # Linux's pid_max cannot exceed 2^22; anything larger in a name is not a process id
# A file another host made (a folder shared between nodes) is removed once nothing has written it for this long: its
# process cannot be seen from here, a live writer keeps writing it, and a job restarted elsewhere (other nodes, a
# container's new host name) would otherwise leave it for good
UNTOUCHED_ELSEWHERE_S = 3600.0


def pid_in_name(name: str, prefix: str, suffix: str = "") -> Optional[int]:
    """The process id between ``prefix`` and ``suffix`` in ``name``, or None when ``name`` is not such a file or
    what stands there is no process id (ASCII digits, 1 to ``MAX_PID``)."""
    if not (name.startswith(prefix) and name.endswith(suffix)) or len(name) < len(prefix) + len(suffix):
        return None
    text = name[len(prefix):len(name) - len(suffix)]
    if not (text.isascii() and text.isdigit()):
        return None
    pid = int(text)
    return pid if 0 < pid <= MAX_PID else None


# ``hidden_name``'s names: ".<kind>.<pid>@<host>@<name>" (a host name has no "@"; the name is anything)
_HIDDEN = re.compile(r"\.(?P<kind>[a-z]+)\.(?P<pid>[0-9]+)@(?P<host>[^@/]+)@(?P<name>.+)")


def hidden_name(name: str, kind: str) -> str:
    """The name of a file this process makes beside ``name`` (``kind``: what it is for, lower-case letters) until it
    renames or removes it: hidden (a save, a load and stock's copy skip names that start with "."), and carrying the
    process and host, so that a later start removes those a killed process left (``remove_hidden_files_of_dead_
    processes``) and never a live one's."""
    return f".{kind}.{os.getpid()}@{socket.gethostname()}@{name}"


def hidden_parts(candidate: str) -> Optional[Tuple[str, int, str, str]]:
    """(kind, pid, host, name) of a ``hidden_name``, or None where ``candidate`` is no such name."""
    match = _HIDDEN.fullmatch(candidate)
    pid = None if match is None else pid_in_name(match["pid"], "")
    return None if pid is None else (match["kind"], pid, match["host"], match["name"])


def remove_hidden_files_of_dead_processes(folder: str, kinds: Iterable[str], held: bool = False) -> List[str]:
    """Remove the ``hidden_name`` files of those ``kinds`` in ``folder`` whose process is gone (another host's once
    untouched for ``UNTOUCHED_ELSEWHERE_S``); with ``held`` (this process holds the folder's lock, so no other
    process can be using it), those of every other process, alive or not. Returns the paths removed."""
    kinds = frozenset(kinds)

    def part(name: str, index: int):
        found = hidden_parts(name)
        return found[index] if found is not None and found[0] in kinds else None

    return remove_files_of_dead_processes(folder, lambda name: part(name, 1), lambda name: part(name, 2), held)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_files_of_dead_processes(folder: str, pid_of: Callable[[str], Optional[int]],
                                   host_of: Optional[Callable[[str], Optional[str]]] = None,
                                   held: bool = False) -> List[str]:
    """Remove the files in ``folder`` whose name ``pid_of`` maps to a process that is gone (None: not such a file).
    ``host_of``: the host a file's name records (None where it records none: judged as this host's); a file another
    host made is removed once nothing has written it for ``UNTOUCHED_ELSEWHERE_S`` instead. ``held``: this process
    holds the folder's lock, so every other process's file is a dead one's, whatever the process id or host (a
    container restarted with a fresh pid namespace gives its new processes the old ones' ids: the killed run's files
    were taken for a live process's, for good: helper-155's review). Returns the paths removed; a file another
    process removed first is skipped."""
    removed, here = [], socket.gethostname()
    for name in os.listdir(folder):
        pid = pid_of(name)
        if pid is None:
            continue
        host = host_of(name) if host_of is not None else None
        path = os.path.join(folder, name)
        try:
            if held:
                if pid == os.getpid() and host in (None, here):
                    continue
            elif host not in (None, here):
                if time.time() - os.stat(path).st_mtime < UNTOUCHED_ELSEWHERE_S:
                    continue
            elif process_alive(pid):
                continue
            os.remove(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed
