"""Files a process killed before its cleanup left behind. Owns: reading the process id a file name carries, telling
whether that process is gone, and removing such files. Does not own: how each writer names its files
(io/drive_rate.py's trial files, io/save_from_files.py's temporary checkpoint files), which it is told.

Plain module: imports nothing of torch or DeepSpeed.
"""
import os
from typing import Callable, List, Optional

MAX_PID = 1 << 22  # Linux's pid_max cannot exceed 2^22; anything larger in a name is not a process id


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


def remove_files_of_dead_processes(folder: str, pid_of: Callable[[str], Optional[int]]) -> List[str]:
    """Remove the files in ``folder`` whose name ``pid_of`` maps to a process that is gone (None: not such a file).
    Returns the paths removed; a file another process removed first is skipped."""
    removed = []
    for name in os.listdir(folder):
        pid = pid_of(name)
        if pid is None or process_alive(pid):
            continue
        path = os.path.join(folder, name)
        try:
            os.remove(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed
