"""`tencache-ds doctor`'s NVMe path checks. Owns: whether the path exists, is writable, has room and takes O_DIRECT,
its mount, its sequential bandwidth measured with plain file I/O (the fallback when the probe's DeepSpeed aio
measurement is missing), and the check lines of that bandwidth and of the drive as tencache's engine uses it. Does
not own: the probe (cli/doctor_probe.py) or the drive measurement (io/drive_rate.py)."""
import contextlib
import dataclasses
import errno
import mmap
import os
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from ..io.drive_rate import DriveRate
from ..units import fmt_bytes
from .doctor_checks import FAIL, OK, WARN, CheckResult

MIN_NVME_FREE_BYTES = 10 << 30     # 10 GiB: less than a 1B-parameter model swaps (fp32 masters + Adam: 12 GB)
BANDWIDTH_FILE_BYTES = 256 << 20   # large enough to leave the drive's write cache, small enough to take < 1 s on NVMe
BANDWIDTH_CHUNK_BYTES = 32 << 20   # one aio request; also the most locked memory the measurement takes
BANDWIDTH_DEADLINE_S = 4.0         # per direction; on a slow disk we report what was done by then
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def _unescape_mount(field: str) -> str:
    r"""/proc/mounts writes space, tab, newline and backslash as octal escapes (\040 ...)."""
    for escape, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escape, char)
    return field


def mount_of(path: str, mounts_text: Optional[str] = None) -> Optional[Dict[str, str]]:
    """The /proc/mounts entry whose mount point is the longest prefix of ``path`` (already resolved)."""
    if mounts_text is None:
        try:
            with open("/proc/mounts") as fh:
                mounts_text = fh.read()
        except OSError:
            return None
    best = None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        device, mount_point, fs_type = _unescape_mount(fields[0]), _unescape_mount(fields[1]), fields[2]
        prefix = mount_point.rstrip("/") + "/"
        if (path == mount_point or path.startswith(prefix) or mount_point == "/") and \
                (best is None or len(mount_point) >= len(best["mount_point"])):
            best = {"device": device, "mount_point": mount_point, "fs_type": fs_type}
    return best


def _o_direct_works(directory: str) -> Tuple[bool, str]:
    """Write one page with O_DIRECT (what DeepSpeed's aio does to swap files). (works, error text)."""
    path = os.path.join(directory, f".tencache-doctor-odirect-{os.getpid()}")
    page = mmap.mmap(-1, mmap.PAGESIZE)  # page-aligned, as O_DIRECT requires
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o600)
        try:
            os.write(fd, page)
        finally:
            os.close(fd)
        return True, ""
    except OSError as err:
        return False, err.strerror or str(err)
    finally:
        page.close()
        with contextlib.suppress(OSError):
            os.remove(path)


def _timed_write_then_read(num_chunks, write_chunk, read_chunk, path, after_writes=None):
    """Write chunks 0.. then read them back, each direction stopping at BANDWIDTH_DEADLINE_S; ``read_chunk``
    returns whether the bytes are the ones written. ``after_writes`` (flush, reopen) counts as write time.
    Returns (chunks written, write seconds, chunks read, read seconds)."""
    started = time.perf_counter()
    written = 0
    for index in range(num_chunks):
        write_chunk(index)
        written += 1
        if time.perf_counter() - started > BANDWIDTH_DEADLINE_S:
            break
    if after_writes is not None:
        after_writes()
    write_s = time.perf_counter() - started
    started = time.perf_counter()
    read = 0
    for index in range(written):
        if not read_chunk(index):
            raise OSError(f"read-back of chunk {index} of {path} returned other bytes than were written")
        read += 1
        if time.perf_counter() - started > BANDWIDTH_DEADLINE_S:
            break
    return written, write_s, read, time.perf_counter() - started


def plain_io_bandwidth(directory: str, total_bytes: int) -> Dict[str, Any]:
    """Sequential write then read of one file with plain os.write/os.readv: O_DIRECT where the filesystem allows
    it, else buffered writes + fsync and reads after dropping the file from the page cache."""
    chunk_bytes = min(BANDWIDTH_CHUNK_BYTES // 4, total_bytes)
    buffer = mmap.mmap(-1, chunk_bytes)
    path = os.path.join(directory, f"tencache-doctor-{os.getpid()}.bin")
    direct = getattr(os, "O_DIRECT", 0)
    method = "plain file I/O (O_DIRECT)"
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o600)
            os.write(fd, buffer)  # some filesystems accept O_DIRECT at open and refuse it here
            os.lseek(fd, 0, os.SEEK_SET)
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
            with contextlib.suppress(NameError, OSError):
                os.close(fd)
            direct = 0
            method = "plain file I/O (buffered; fsync, then page cache dropped before reading)"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        read_fd = None

        def write_chunk(index):
            buffer[0] = index % 251
            os.write(fd, buffer)

        def after_writes():
            nonlocal fd, read_fd
            os.fsync(fd)
            os.close(fd)
            fd = None
            read_fd = os.open(path, os.O_RDONLY | direct)
            if not direct and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(read_fd, 0, 0, os.POSIX_FADV_DONTNEED)

        def read_chunk(index):
            return os.readv(read_fd, [buffer]) == chunk_bytes and buffer[0] == index % 251

        try:
            written, write_s, read, read_s = _timed_write_then_read(total_bytes // chunk_bytes, write_chunk,
                                                                    read_chunk, path, after_writes)
        finally:
            for descriptor in (fd, read_fd):
                with contextlib.suppress(OSError, TypeError):
                    os.close(descriptor)
    finally:
        buffer.close()
        with contextlib.suppress(OSError):
            os.remove(path)
    return {"method": method, "write_bytes": written * chunk_bytes, "write_s": write_s,
            "read_bytes": read * chunk_bytes, "read_s": read_s}


@dataclasses.dataclass
class NvmePathState:
    """What the path checks found; ``usable`` means writable, so the bandwidth can be measured there."""

    path: str
    checks: List[CheckResult]
    usable: bool = False
    enough_space_for_bandwidth: bool = False
    created_root: Optional[str] = None  # the top-most folder the doctor created; removed at the end

    def cleanup(self) -> None:
        if self.created_root:
            shutil.rmtree(self.created_root, ignore_errors=True)


def check_nvme_path(path: str, source: str) -> NvmePathState:
    """Exists or creatable, writable, free space, filesystem (and O_DIRECT). ``source`` says where the path came
    from, for the messages."""
    fix = "choose a folder on a local SSD/NVMe that this user can write, with --nvme-path"
    if path.startswith("~"):  # DeepSpeed joins it as given: the run would swap into ./~/... under its working folder
        state = NvmePathState(os.path.abspath(path), [])
        state.checks.append(CheckResult(
            "nvme path", FAIL, f"{path} ({source}) starts with '~', which DeepSpeed does not expand (the run would "
            f"swap into {os.path.abspath(path)}): give the folder as an absolute path", {"path": path}))
        return state
    path = os.path.abspath(path)
    state = NvmePathState(path, [])
    if os.path.exists(path) and not os.path.isdir(path):
        state.checks.append(CheckResult("nvme path", FAIL, f"{path} ({source}) exists and is not a directory; {fix}",
                                        {"path": path}))
        return state
    if os.path.isdir(path):
        state.checks.append(CheckResult("nvme path", OK, f"{path} ({source}) exists", {"path": path, "created": False}))
    else:
        missing = path
        while not os.path.exists(os.path.dirname(missing)) and os.path.dirname(missing) != missing:
            missing = os.path.dirname(missing)
        try:
            os.makedirs(path)
        except OSError as err:
            state.checks.append(CheckResult("nvme path", FAIL, f"cannot create {path} ({source}): "
                                            f"{err.strerror or err}; {fix}", {"path": path, "errno": err.errno}))
            return state
        state.created_root = missing
        state.checks.append(CheckResult("nvme path", OK, f"{path} ({source}) did not exist; created for the checks "
                                        "and removed afterwards", {"path": path, "created": True}))
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".tencache-doctor-") as fh:
            fh.write(b"\0" * 4096)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        state.checks.append(CheckResult("nvme writable", FAIL, f"{path} is not writable: {err.strerror or err}; {fix}",
                                        {"path": path, "errno": err.errno}))
        return state
    state.usable = True
    state.checks.append(CheckResult("nvme writable", OK, f"{path} is writable"))
    usage = shutil.disk_usage(path)
    space = {"free_bytes": usage.free, "total_bytes": usage.total}
    state.enough_space_for_bandwidth = usage.free > 2 * BANDWIDTH_FILE_BYTES
    if usage.free < MIN_NVME_FREE_BYTES:
        state.checks.append(CheckResult("nvme free space", WARN, f"{fmt_bytes(usage.free)} free of "
                                        f"{fmt_bytes(usage.total)}, below {fmt_bytes(MIN_NVME_FREE_BYTES)}; NVMe offload "
                                        "swaps ~18 bytes per parameter (fp32 masters, Adam moments and gradients, "
                                        "bf16 parameters)", space))
    else:
        state.checks.append(CheckResult("nvme free space", OK, f"{fmt_bytes(usage.free)} free of "
                                        f"{fmt_bytes(usage.total)}", space))
    mount = mount_of(os.path.realpath(path)) or {"device": "?", "mount_point": "?", "fs_type": "unknown"}
    direct_ok, direct_error = _o_direct_works(path)
    details = dict(mount, o_direct=direct_ok)
    where = f"{mount['fs_type']} on {mount['device']} (mounted at {mount['mount_point']})"
    if direct_ok and mount["fs_type"] in RAM_FILESYSTEMS:
        state.checks.append(CheckResult("nvme filesystem", WARN, f"{where}; O_DIRECT works, but {mount['fs_type']} "
                                        "lives in RAM: swap files there compete with the host cache for memory and "
                                        "say nothing about NVMe speed", details))
    elif direct_ok:
        state.checks.append(CheckResult("nvme filesystem", OK, f"{where}; O_DIRECT works", details))
    else:
        state.checks.append(CheckResult("nvme filesystem", FAIL, f"{where}; O_DIRECT fails ({direct_error}), and "
                                        f"DeepSpeed opens swap files with O_DIRECT; {fix}", details))
    return state


def nvme_bandwidth(path: str, facts: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[str]]:
    """The sequential bandwidth of ``path``: the probe's DeepSpeed-aio measurement when it made one (the probe was
    started with ``bandwidth_dir=path``), else plain file I/O there. Shared by doctor and `tencache-ds bench`.

    Returns:
        (measurement, aio_error): the measurement as _aio_bandwidth/plain_io_bandwidth return it, and why the aio
        measurement failed when it was tried and did (else None).

    Raises:
        OSError: the plain file I/O failed.
    """
    if "bandwidth" in facts:
        return facts["bandwidth"], None
    return plain_io_bandwidth(path, BANDWIDTH_FILE_BYTES), facts.get("bandwidth_error")


def bytes_per_s(measurement: Dict[str, Any]) -> Tuple[float, float]:
    """(read, write) bytes per second of a bandwidth measurement."""
    return (measurement["read_bytes"] / max(measurement["read_s"], 1e-9),
            measurement["write_bytes"] / max(measurement["write_s"], 1e-9))


def bandwidth_check(result: Optional[Dict[str, Any]], error: Optional[str]) -> CheckResult:
    if result is None:
        return CheckResult("nvme bandwidth", WARN, f"not measured: {error}")
    read_bytes_per_s, write_bytes_per_s = bytes_per_s(result)
    write_gbps = write_bytes_per_s / 1e9
    read_gbps = read_bytes_per_s / 1e9
    details = dict(result, write_gb_per_s=write_gbps, read_gb_per_s=read_gbps)
    text = (f"write {write_gbps:.2f} GB/s, read {read_gbps:.2f} GB/s ({fmt_bytes(result['write_bytes'])} sequential, "
            f"{result['method']})")
    return CheckResult("nvme bandwidth", OK, text, details)


def drive_check(facts: Dict[str, Any], why_not: Optional[str] = None) -> CheckResult:
    """The probe's measurement of the drive through tencache's own engine (io/drive_rate.py), or why there is none
    (``why_not``, else the probe's error)."""
    if "drive" not in facts:
        return CheckResult("nvme drive", WARN, f"not measured with tencache's engine: "
                           f"{why_not or facts.get('drive_error') or 'the probe ended before it measured'}")
    rate = DriveRate.from_dict(facts["drive"])
    return CheckResult("nvme drive", OK, f"{rate.describe()} ({rate.method}; fastest trial of each)",
                       rate.to_dict())
