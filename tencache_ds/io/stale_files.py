"""Files a process killed before its cleanup left behind. Owns: telling whether the process a file name names is
gone, and removing such files. Does not own: how each writer names its files (io/drive_rate.py's trial files,
io/cloned_save.py's temporary checkpoint files), which it is told.

Plain module: imports nothing of torch or DeepSpeed.
"""
import os
from typing import Callable, List, Optional


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
