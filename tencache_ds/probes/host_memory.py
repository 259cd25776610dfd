"""How much host memory this process can still get. Owns: reading the node's memory (/proc/meminfo) and the memory
cgroup the process runs in, with its ancestors (cgroup v2: memory.max, memory.high, memory.current, memory.stat;
v1: memory.limit_in_bytes, memory.usage_in_bytes, memory.stat), and this process's resident set. Does not own:
deciding anything with the numbers (plan/budget.py at start-up, plan/memory_pressure.py during the run).

Why the cgroup: in a container (Kubernetes, Slurm, ``docker --memory``) /proc/meminfo describes the whole machine,
while the kernel's OOM killer acts on the cgroup's limit. A budget taken from /proc/meminfo alone can be larger
than everything the container may use.

Two numbers per bound. *Available*: what can be allocated without taking page cache that is in use (a cgroup's
limit less its "working set", usage less inactive page cache, which Kubernetes evicts by; the node's MemAvailable,
plus the free pages in the kernel's per-CPU lists, which MemAvailable leaves out: ``per_cpu_free_bytes``).
Below it the kernel reclaims active pages (the libraries' code, files being read) and the job slows down: the
host tier gives memory back here. *Allocatable*: what can be allocated before the OOM killer acts (a cgroup's limit
less its usage without any page cache, since without swap only page cache can be reclaimed; the node's, as
available). Every cgroup level up to the root of the mounted hierarchy bounds both; a container's limit is
often set on a parent. memory.high (v2) counts as a limit: above it the kernel throttles the whole cgroup into
reclaim, which stalls training as surely as a kill ends it.

Reads small files only (microseconds; /proc/zoneinfo about 150 µs on this 2-CPU VM, more with more CPUs: read once
per forward pass); imports neither torch nor deepspeed. Inside a container whose /proc/meminfo is virtualised (LXCFS)
/proc/zoneinfo is the host's: its per-CPU pages are bounded there by the container's MemTotal and by its cgroup.
"""
import dataclasses
import os
import threading
from typing import Dict, Iterable, List, Optional, Tuple

# v1 reports "no limit" as the largest page-aligned signed 64-bit number; anything this large is no limit.
_UNLIMITED_THRESHOLD = 1 << 60


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """``total_bytes``: the memory this process's node or cgroup has in all (the smaller); ``available_bytes``: what
    it can still allocate without reclaiming page cache in use; ``allocatable_bytes``: before the OOM killer acts
    (at least ``available_bytes``); each the smallest over the node and every enclosing cgroup. ``bound_by``:
    "node", or the cgroup folder with the least available (for messages)."""

    total_bytes: int
    available_bytes: int
    allocatable_bytes: int = -1  # -1: the same as available_bytes
    bound_by: str = "node"

    def __post_init__(self):
        if self.allocatable_bytes < self.available_bytes:
            object.__setattr__(self, "allocatable_bytes", self.available_bytes)


@dataclasses.dataclass(frozen=True)
class CgroupLevel:
    """One cgroup on the way from this process's to the root of its hierarchy, with a limit."""

    folder: str
    limit_bytes: int
    working_set_bytes: int  # usage less inactive page cache
    unreclaimable_bytes: int = 0  # usage less all page cache (anonymous memory, kernel memory, shared memory)

    @property
    def headroom_bytes(self) -> int:
        return max(0, self.limit_bytes - self.working_set_bytes)

    @property
    def hard_headroom_bytes(self) -> int:
        return max(0, self.limit_bytes - self.unreclaimable_bytes)


def read_host_memory(proc: str = "/proc") -> HostMemory:
    """The node's memory, bounded by the cgroups this process runs in. ``proc``: for tests of other layouts."""
    total, available = _node_memory(proc)
    memory = HostMemory(total, available, available, "node")
    for level in cgroup_levels(proc):
        memory = HostMemory(total_bytes=min(memory.total_bytes, level.limit_bytes),
                            available_bytes=min(memory.available_bytes, level.headroom_bytes),
                            allocatable_bytes=min(memory.allocatable_bytes, level.hard_headroom_bytes),
                            bound_by=level.folder if level.headroom_bytes < memory.available_bytes
                            else memory.bound_by)
    return memory


def cgroup_levels(proc: str = "/proc") -> List[CgroupLevel]:
    """The memory cgroups with a limit that enclose this process, innermost first (empty when none, or when the
    cgroup file system is not mounted where this process can see it)."""
    folder, root, version = memory_cgroup_folder(proc)
    if folder is None:
        return []
    levels = []
    while True:
        level = _read_level(folder, version)
        if level is not None:
            levels.append(level)
        parent = os.path.dirname(folder)
        if os.path.normpath(folder) == os.path.normpath(root) or parent == folder:
            return levels
        folder = parent


def memory_cgroup_folder(proc: str = "/proc") -> Tuple[Optional[str], Optional[str], int]:
    """(this process's memory cgroup folder, the mounted hierarchy's root folder, cgroup version 1 or 2); (None,
    None, 0) when there is none. The v1 memory controller wins where a machine mounts both (it can be attached
    to one hierarchy only, so v2 then has no memory files)."""
    try:
        with open(os.path.join(proc, "self", "cgroup")) as handle:
            memberships = [line.rstrip("\n").split(":", 2) for line in handle if line.count(":") >= 2]
        with open(os.path.join(proc, "self", "mountinfo")) as handle:
            mounts = [_parse_mountinfo(line) for line in handle]
    except OSError:
        return None, None, 0
    v1_path = next((path for _id, controllers, path in memberships if "memory" in controllers.split(",")), None)
    v2_path = next((path for hierarchy, controllers, path in memberships if hierarchy == "0" and not controllers),
                   None)
    for fstype, wanted_path, version in (("cgroup", v1_path, 1), ("cgroup2", v2_path, 2)):
        if wanted_path is None:
            continue
        for mount_root, mount_point, mount_fstype, super_options in mounts:
            if mount_fstype != fstype or (version == 1 and "memory" not in super_options.split(",")):
                continue
            relative = os.path.relpath(wanted_path, mount_root)
            if relative.startswith(".."):
                continue  # this mount shows another part of the hierarchy
            folder = os.path.normpath(os.path.join(mount_point, relative))
            if version == 2:
                # a v2 folder has memory files only where its parent enables the controller for its children; an
                # ancestor's limit binds it all the same (a systemd slice with MemoryMax above a job without
                # accounting: helper-235), and cgroup_levels walks up to it past the levels without files
                # (a membership the mount does not show, the mount point itself limited: its limit, read there)
                if os.path.isdir(folder) or os.path.exists(os.path.join(mount_point, "memory.max")):
                    return folder, mount_point, version
                continue
            if os.path.exists(os.path.join(folder, "memory.limit_in_bytes")) or \
                    os.path.exists(os.path.join(mount_point, "memory.limit_in_bytes")):
                return folder, mount_point, version
    return None, None, 0


def anonymous_resident_bytes(proc: str = "/proc") -> int:
    """This process's resident memory that only its own freeing gives back (without swap): anonymous and shared
    anonymous pages (RssAnon + RssShmem in /proc/self/status; Python's anonymous mmap, which backs the optimizer's
    pageable buffers, is shared). Mapped files are not in it: the kernel reclaims those itself.

    The file stays open and is read whole at offset 0 (procfs regenerates it): the footprint meter reads it 50
    times a second, and in a training process (2 ranks of gpt2-small on 2 cores, 2026-11-27) opening it and
    reading it line by line took 230 µs of CPU a read, opening and reading it whole 150 µs, a read of the open file
    60 µs."""
    data = os.pread(_status_fd(os.path.join(proc, "self", "status")), 1 << 16, 0)
    total = 0
    for key in (b"\nRssAnon:", b"\nRssShmem:"):
        start = data.find(key)
        if start >= 0:
            total += int(data[start + len(key):data.index(b"kB", start)]) * 1024
    return total


_status_fds: Dict[str, int] = {}  # path -> open descriptor ("self" names the process that opened it)
_status_fds_lock = threading.Lock()  # the footprint meter's thread and the training thread both read


def _status_fd(path: str) -> int:
    with _status_fds_lock:
        fd = _status_fds.get(path)
        if fd is None:
            fd = _status_fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return fd


def _forget_status_fds_in_child() -> None:
    """A forked child's inherited descriptors describe its parent: closed, and opened again at the child's first
    read."""
    global _status_fds_lock
    _status_fds_lock = threading.Lock()  # the parent's may have been held by another thread at the fork
    for fd in _status_fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _status_fds.clear()


os.register_at_fork(after_in_child=_forget_status_fds_in_child)


# ------------------------------------------------------------------------------------------------------- private
def _node_memory(proc: str) -> Tuple[int, int]:
    fields = {}
    with open(os.path.join(proc, "meminfo")) as handle:
        for line in handle:
            key, _, value = line.partition(":")
            parts = value.split()
            if parts:
                fields[key] = int(parts[0]) * 1024  # kB
    total = fields["MemTotal"]
    available = fields.get("MemAvailable", fields.get("MemFree", total))
    return total, min(total, available + per_cpu_free_bytes(proc))


def per_cpu_free_bytes(proc: str = "/proc", cpus: Optional[Iterable[int]] = None) -> int:
    """Free pages the kernel keeps in the per-CPU lists of the CPUs this process may run on (``cpus``, default its
    affinity; ``count`` of their pagesets in /proc/zoneinfo): free, but in neither MemFree nor MemAvailable. An
    allocation takes its own CPU's list first; other CPUs' lists are drained only after direct reclaim has failed,
    so only this process's CPUs count. Since Linux 6.7 the lists grow with the freeing they see: after freeing 3 GB
    of tensors this VM's 2 CPUs held 1.3 GiB there (``high`` 1316 MiB each), and between steps of gpt2-1.3b
    MemAvailable read about that much less than the training process could take, so the memory governor gave 1.6
    and 2.1 GiB of host cache back in two runs where the step's rise left room (2026-11-29). Read after meminfo, not
    at the same instant: pages moving between the two in between (a list's refill or drain, a batch at a time) are
    counted twice or not at all. 0 where the file is missing or unreadable."""
    allowed = set(os.sched_getaffinity(0) if cpus is None else cpus)
    pages, cpu = 0, None
    try:
        with open(os.path.join(proc, "zoneinfo")) as handle:
            for line in handle:
                key, _, value = line.strip().partition(":")
                if key == "cpu":  # a pageset's header
                    cpu = int(value)
                elif key == "count" and cpu in allowed:  # only the pagesets' lines are called so
                    pages += int(value)
                elif key.startswith("Node "):
                    cpu = None
    except (OSError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _parse_mountinfo(line: str) -> Tuple[str, str, str, str]:
    """(root within the file system, mount point, file system type, super options) of one mountinfo line."""
    left, _, right = line.partition(" - ")
    fields, tail = left.split(), right.split()
    return _unescape(fields[3]), _unescape(fields[4]), tail[0] if tail else "", tail[2] if len(tail) > 2 else ""


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def cgroup_usage(folder: str, version: int) -> Optional[Tuple[int, int]]:
    """(working set, unreclaimable) bytes of the cgroup at ``folder``: its usage less its inactive page cache, and
    less all of its page cache; None when unreadable."""
    usage = _read_int(folder, "memory.usage_in_bytes" if version == 1 else "memory.current")
    if usage is None:
        return None
    prefix = "total_" if version == 1 else ""  # v1: the cgroup and its descendants
    stat = _stat_values(folder, (prefix + "inactive_file", prefix + "active_file"))
    inactive, active = (stat.get(prefix + key, 0) for key in ("inactive_file", "active_file"))
    return max(0, usage - inactive), max(0, usage - inactive - active)


def _read_level(folder: str, version: int) -> Optional[CgroupLevel]:
    if version == 1:
        limit = _read_int(folder, "memory.limit_in_bytes")
    else:
        limits = [value for value in (_read_int(folder, "memory.max"), _read_int(folder, "memory.high"))
                  if value is not None]
        limit = min(limits) if limits else None
    usage = cgroup_usage(folder, version)
    if limit is None or limit >= _UNLIMITED_THRESHOLD or usage is None:
        return None
    return CgroupLevel(folder, limit, *usage)


def _read_int(folder: str, name: str) -> Optional[int]:
    """The number in a cgroup file; None when the file is missing or says "max" (v2's no limit)."""
    try:
        with open(os.path.join(folder, name)) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def _stat_values(folder: str, keys) -> Dict[str, int]:
    """The ``keys`` of the cgroup's memory.stat that are there (one read)."""
    values = {}
    try:
        with open(os.path.join(folder, "memory.stat")) as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name in keys:
                    values[name] = int(value)
    except (OSError, ValueError):
        pass
    return values
