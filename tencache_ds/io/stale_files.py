"""Files a process killed before its cleanup left behind. Owns: reading the process id a file name carries, telling
whether that process is gone, and removing such files, also where another host made them. Does not own: how each
writer names its files (io/drive_rate.py's trial files, io/save_from_files.py's temporary checkpoint files,
checkpoint-for-cpu's ZeRO files being filled), which it is told.

Plain module: imports nothing of torch or DeepSpeed.
"""
import os
import socket
import time
from typing import Callable, List, Optional

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


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_files_of_dead_processes(folder: str, pid_of: Callable[[str], Optional[int]],
                                   host_of: Optional[Callable[[str], Optional[str]]] = None) -> List[str]:
    """Remove the files in ``folder`` whose name ``pid_of`` maps to a process that is gone (None: not such a file).
    ``host_of``: the host a file's name records (None where it records none: judged as this host's); a file another
    host made is removed once nothing has written it for ``UNTOUCHED_ELSEWHERE_S`` instead. Returns the paths
    removed; a file another process removed first is skipped."""
    removed, here = [], socket.gethostname()
    for name in os.listdir(folder):
        pid = pid_of(name)
        if pid is None:
            continue
        host = host_of(name) if host_of is not None else None
        path = os.path.join(folder, name)
        try:
            if host not in (None, here):
                if time.time() - os.stat(path).st_mtime < UNTOUCHED_ELSEWHERE_S:
                    continue
            elif process_alive(pid):
                continue
            os.remove(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed
