"""DeepSpeed's shared-memory all-reduce buffers: their names, and the removal of the ones a run created.

On the CPU accelerator, when every rank runs on this machine (the deepspeed launcher sets LOCAL_SIZE to the number
of local ranks; a plain `python` run sets none and gets no buffer), DeepSpeed's shm_comm op creates one POSIX
shared-memory file per rank while the communication backend starts (deepspeed/ops/csrc/cpu/comm/shm.cpp,
shm_initialize), about 69 MB each:

    /dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>

Each rank creates its own file and maps every other rank's by that name, then never opens one by name again; and
nothing unlinks them, so every launched run leaves one per rank behind, holding RAM (tmpfs) until the machine
restarts. A file can be unlinked as soon as every rank has mapped it: the mappings keep the memory until the
processes end. The master port tells one run's files from another's: two runs alive at once cannot share it.

Imports nothing from tencache_ds (stock runs of scripts/train.py never import the package)."""
import glob
import os

SHM_DIR = "/dev/shm"
PREFIX = "deepspeed_allreduce_buffer"


def buffer_path(uid: int, addr: str, port, rank: int) -> str:
    """The file shm_initialize creates for ``rank`` of the run whose master is ``addr``:``port``."""
    return os.path.join(SHM_DIR, f"{PREFIX}_{uid}_{addr}_{port}_{rank}")


def creates_buffers(environ=None) -> bool:
    """Whether DeepSpeed's shm_comm initialisation makes buffers in a process with this environment: only when
    every rank is local (shm_interface.cpp, initialize: WORLD_SIZE == LOCAL_SIZE >= 1)."""
    environ = os.environ if environ is None else environ
    local_size = int(environ.get("LOCAL_SIZE", "0") or 0)
    return local_size >= 1 and local_size == int(environ.get("WORLD_SIZE", "1"))


def own_buffer_path(environ=None) -> str:
    """This rank's buffer (global rank: all ranks are local when there is one)."""
    environ = os.environ if environ is None else environ
    return buffer_path(os.getuid(), environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", ""),
                       int(environ.get("RANK", "0")))


def remove_own_buffer(environ=None) -> bool:
    """Unlink this rank's buffer; call once every rank has mapped it (after the backend started on all ranks).
    Returns whether there was one."""
    try:
        os.unlink(own_buffer_path(environ))
        return True
    except FileNotFoundError:
        return False


def run_buffers(port) -> list:
    """The buffers still on /dev/shm of the run (this user's) whose master port is ``port``, any address, any rank."""
    pattern = os.path.join(SHM_DIR, f"{PREFIX}_{os.getuid()}_*_{port}_*")
    return sorted(path for path in glob.glob(pattern) if path.rsplit("_", 2)[-2] == str(port))


def remove_run_buffers(port) -> list:
    """Unlink the buffers of the run whose master port is ``port`` (a run that died before it could); returns the
    paths it removed."""
    removed = []
    for path in run_buffers(port):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed
