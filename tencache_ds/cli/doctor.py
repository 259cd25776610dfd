"""`tencache-ds doctor`: is this machine ready for ZeRO-Infinity with tencache_ds? Owns: the environment checks
(versions, accelerator, libaio, DeepSpeed's async_io op, the native arena, memlock, host, GPUs, the NVMe path and its
bandwidth, what "auto" budgets resolve to) and their report, one OK/WARN/FAIL line each. Does not own: budget
arithmetic (plan/budget.py) or the arena (memory/).

Everything that imports torch or DeepSpeed runs in a child process (the "probe", `_probe_main`) with a timeout:
loading the async_io op may JIT-build it for minutes, and a broken op can abort the process that loads it (a failed
aio read ends in "terminate called without an active exception"). The doctor process itself never imports them,
so a crash there becomes a FAIL line, and `--json` output is not interleaved with DeepSpeed's log lines.

The probe must never leave torch's extension build lock behind (ext_lock.py says why that hangs every later
DeepSpeed process on the machine): it runs in its own session and process group; on timeout everything in that
session is killed (ninja's compilers included) and the locks it was building under are removed. A stale lock found
before the probe starts is reported, and the probe then does not load the op behind it (it would only wait on that
lock until its timeout).

Test hook: ``TENCACHE_DOCTOR_FORCE_NO_AIO=1`` (read only in `_probe_env`) runs the real probe with ``CC`` pointing at a
compiler that does not exist, so DeepSpeed's own libaio link test (``has_function("io_submit", ("aio",))``) fails
and the op refuses to JIT-load -- the path a machine without libaio-dev takes.
"""
import contextlib
import dataclasses
import errno
import json
import mmap
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import ext_lock
from ..units import fmt_bytes

OK, WARN, FAIL = "OK", "WARN", "FAIL"
STATUS_ORDER = (OK, WARN, FAIL)

DEFAULT_NVME_PATH = "/tmp/tencache-bench-nvme"  # also the default of `tencache-ds bench --nvme-path`
EXPECTED_DEEPSPEED_VERSION = "0.19.8"
FORCE_NO_AIO_ENV = "TENCACHE_DOCTOR_FORCE_NO_AIO"
MISSING_COMPILER = "/nonexistent/tencache-doctor-forced-no-aio/cc"

MIN_MEMLOCK_BYTES = 1 << 30        # 1 GiB: below this, stock DeepSpeed's default pinned pools already do not fit
MIN_NVME_FREE_BYTES = 10 << 30     # 10 GiB: less than a 1B-parameter model swaps (fp32 masters + Adam: 12 GB)
BANDWIDTH_FILE_BYTES = 256 << 20   # large enough to leave the drive's write cache, small enough to take < 1 s on NVMe
BANDWIDTH_CHUNK_BYTES = 32 << 20   # one aio request; also the most locked memory the measurement takes
BANDWIDTH_DEADLINE_S = 4.0         # per direction; on a slow disk we report what was done by then
PROBE_TIMEOUT_S = 180.0            # a first JIT build of async_io takes 1-2 minutes on 2 cores
PROBE_MARKER = "TENCACHE_DOCTOR_PROBE "
AIO_OP = "async_io"                # DeepSpeed's op name = its build folder in torch's extension cache
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


@dataclasses.dataclass
class CheckResult:
    """One line of the report. ``details`` holds the raw numbers for --json."""

    name: str
    status: str
    message: str
    details: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def line(self) -> str:
        return f"{self.status:<4}  {self.name:<16} {self.message}"


# ----------------------------------------------------------------------------------------------------------------
# The probe: a child process that imports torch/DeepSpeed, loads async_io and measures aio bandwidth
# ----------------------------------------------------------------------------------------------------------------
def _emit(**facts: Any) -> None:
    """Report facts to the parent as they are learned, so a crash later still leaves the earlier ones."""
    sys.stdout.write(PROBE_MARKER + json.dumps(facts) + "\n")
    sys.stdout.flush()


def _probe_main(argv: Sequence[str]) -> None:
    """Entry point of the probe process. argv: [--aio] [--bandwidth-dir DIR --bandwidth-bytes N]."""
    args = list(argv)
    want_aio = "--aio" in args
    bandwidth_dir = args[args.index("--bandwidth-dir") + 1] if "--bandwidth-dir" in args else None
    bandwidth_bytes = int(args[args.index("--bandwidth-bytes") + 1]) if "--bandwidth-bytes" in args else 0
    try:
        import torch
        import deepspeed
    except Exception as err:  # report any import failure; the parent turns it into a FAIL line
        _emit(import_error=f"{type(err).__name__}: {err}")
        return
    _emit(versions={"torch": torch.__version__, "deepspeed": deepspeed.__version__})
    try:
        from deepspeed.accelerator import get_accelerator
        accelerator = get_accelerator()
        _emit(accelerator={"device_name": accelerator.device_name(), "name": accelerator._name,
                           "communication_backend": accelerator.communication_backend_name(),
                           "device_count": accelerator.device_count()})
    except Exception as err:
        _emit(accelerator_error=f"{type(err).__name__}: {err}")
    if not want_aio:
        return
    from deepspeed.ops.op_builder import AsyncIOBuilder
    started = time.perf_counter()
    try:
        compatible = bool(AsyncIOBuilder().is_compatible())
    except Exception as err:
        _emit(aio_compatible=False, aio_compatible_error=f"{type(err).__name__}: {err}")
        return
    _emit(aio_compatible=compatible, aio_compatible_s=time.perf_counter() - started)
    if not compatible:
        return
    started = time.perf_counter()
    try:
        module = AsyncIOBuilder().load(verbose=False)
    except Exception as err:
        _emit(aio_loaded=False, aio_load_error=f"{type(err).__name__}: {err}")
        return
    _emit(aio_loaded=True, aio_module=getattr(module, "__file__", str(module)),
          aio_load_s=time.perf_counter() - started)
    if bandwidth_dir and bandwidth_bytes > 0:
        try:
            _emit(bandwidth=_aio_bandwidth(torch, module, bandwidth_dir, bandwidth_bytes))
        except Exception as err:
            _emit(bandwidth_error=f"{type(err).__name__}: {err}")


def _aio_bandwidth(torch, module, directory: str, total_bytes: int) -> Dict[str, Any]:
    """Sequential write then read of one ``total_bytes`` file through DeepSpeed's aio handle (O_DIRECT), in
    BANDWIDTH_CHUNK_BYTES requests; each chunk is checked on read-back. Stops a direction at its deadline."""
    # aio_handle(block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism): DeepSpeed's defaults
    # for swapping (aio_config.py), so the number is what its swapper would see.
    handle = module.aio_handle(1 << 20, 8, False, True, 1)
    chunk_bytes = min(BANDWIDTH_CHUNK_BYTES, total_bytes)
    try:
        buffer = handle.new_cpu_locked_tensor(chunk_bytes, torch.empty(0, dtype=torch.uint8))
        locked = True
    except Exception:  # memlock too low: DeepSpeed bounces through its own pinned buffer instead
        buffer = torch.empty(chunk_bytes, dtype=torch.uint8)
        locked = False
    path = os.path.join(directory, f"tencache-doctor-{os.getpid()}.bin")
    try:
        def write_chunk(index):
            buffer.fill_(index % 251)
            if handle.sync_pwrite(buffer, path, index * chunk_bytes) < 0:
                raise OSError(f"aio write of {fmt_bytes(chunk_bytes)} at offset {index * chunk_bytes} to {path} "
                              "failed")

        def read_chunk(index):
            if handle.sync_pread(buffer, path, index * chunk_bytes) < 0:
                raise OSError(f"aio read of {fmt_bytes(chunk_bytes)} at offset {index * chunk_bytes} from {path} "
                              "failed")
            return int(buffer[0]) == index % 251 and int(buffer[-1]) == index % 251

        written, write_s, read, read_s = _timed_write_then_read(total_bytes // chunk_bytes, write_chunk,
                                                                read_chunk, path)
    finally:
        if locked:
            handle.free_cpu_locked_tensor(buffer)
        with contextlib.suppress(OSError):
            os.remove(path)
    return {"method": "DeepSpeed aio (O_DIRECT)", "buffer_locked": locked,
            "write_bytes": written * chunk_bytes, "write_s": write_s,
            "read_bytes": read * chunk_bytes, "read_s": read_s}


def _probe_env() -> Tuple[Dict[str, str], bool]:
    """The probe's environment and whether the aio op is forced missing (the one place FORCE_NO_AIO_ENV is read)."""
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    forced = env.get(FORCE_NO_AIO_ENV, "") not in ("", "0")
    if forced:
        env["CC"] = MISSING_COMPILER  # DeepSpeed's libaio link test then fails, exactly as without libaio-dev
    return env, forced


class Probe:
    """The probe process, started early and collected late so the doctor's own checks overlap with it."""

    def __init__(self, want_aio: bool, bandwidth_dir: Optional[str], bandwidth_bytes: int,
                 timeout_s: float = PROBE_TIMEOUT_S, skip_aio_reason: Optional[str] = None):
        env, self.forced_no_aio = _probe_env()
        self.skip_aio_reason = skip_aio_reason  # why async_io is not loaded although it was wanted
        want_aio = want_aio and skip_aio_reason is None
        argv = ["--aio"] if want_aio else []
        if bandwidth_dir:
            argv += ["--bandwidth-dir", bandwidth_dir, "--bandwidth-bytes", str(bandwidth_bytes)]
        code = "import sys; from tencache_ds.cli.doctor import _probe_main; _probe_main(sys.argv[1:])"
        self.timeout_s = timeout_s
        self._bandwidth_dir = bandwidth_dir
        # A lock present now is not ours to remove, whatever happens to the probe.
        self.extensions_root = ext_lock.extensions_root(env)
        self._locks_before = set(ext_lock.find_locks(self.extensions_root))
        self.started = time.perf_counter()
        # start_new_session: the probe leads its own session and process group, so a timeout can kill all it started.
        self._process = subprocess.Popen([sys.executable, "-c", code, *argv], env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self._facts: Optional[Dict[str, Any]] = None

    def facts(self) -> Dict[str, Any]:
        """What the probe reported, plus "returncode", "timed_out", "output_tail" and "elapsed_s"."""
        if self._facts is not None:
            return self._facts
        remaining_s = max(0.1, self.timeout_s - (time.perf_counter() - self.started))
        timed_out = False
        facts: Dict[str, Any] = {"removed_build_locks": [], "kept_build_locks": []}
        try:
            output, _ = self._process.communicate(timeout=remaining_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            # Which new build locks is the probe building under? Asked before the kill: afterwards nobody holds them.
            new_locks = set(ext_lock.find_locks(self.extensions_root)) - self._locks_before
            ours = ext_lock.locks_used_by_session(self._process.pid, sorted(new_locks))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, 9)
            # ninja's compilers each lead a process group of their own, outside the killpg above, but stay in the
            # probe's session: kill that too, so no orphan compiler writes into the build folder after we unlock it.
            ext_lock.kill_session(self._process.pid)
            output, _ = self._process.communicate()
            facts["removed_build_locks"], facts["kept_build_locks"] = ext_lock.remove_abandoned_locks(ours)
        if self._bandwidth_dir:  # the probe removes its file itself, unless it was killed or crashed mid-way
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self._bandwidth_dir, f"tencache-doctor-{self._process.pid}.bin"))
        other_lines = []
        for line in (output or "").splitlines():
            if line.startswith(PROBE_MARKER):
                with contextlib.suppress(json.JSONDecodeError):
                    facts.update(json.loads(line[len(PROBE_MARKER):]))
            elif line.strip():
                other_lines.append(line)
        facts.update(returncode=self._process.returncode, timed_out=timed_out,
                     output_tail="\n".join(other_lines[-8:]), elapsed_s=time.perf_counter() - self.started)
        self._facts = facts
        return facts

    def crash_text(self) -> str:
        facts = self.facts()
        if facts["timed_out"]:
            text = f"the probe process did not finish in {self.timeout_s:g} s"
            if facts["removed_build_locks"]:
                text += (f"; it was killed mid-build, and the build lock(s) it left were removed "
                         f"({', '.join(facts['removed_build_locks'])})")
            if facts["kept_build_locks"]:
                text += (f"; build lock(s) it created are still in use by another process and were kept "
                         f"({', '.join(facts['kept_build_locks'])})")
            return text
        code = facts["returncode"]
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        tail = facts["output_tail"].strip().splitlines()
        return f"the probe process {how}" + (f" ({tail[-1].strip()[:200]})" if tail else "")


# ----------------------------------------------------------------------------------------------------------------
# Checks that read the probe's facts
# ----------------------------------------------------------------------------------------------------------------
def check_versions(probe: Probe) -> CheckResult:
    facts = probe.facts()
    python = platform.python_version()
    if "versions" not in facts:
        reason = facts.get("import_error") or probe.crash_text()
        return CheckResult("versions", FAIL, f"could not read the torch/deepspeed versions: {reason}",
                           {"python": python})
    versions = dict(facts["versions"], python=python)
    text = f"python {python}, torch {versions['torch']}, deepspeed {versions['deepspeed']}"
    if versions["deepspeed"] != EXPECTED_DEEPSPEED_VERSION:
        return CheckResult("versions", WARN, f"{text}; tencache_ds is written against deepspeed "
                           f"{EXPECTED_DEEPSPEED_VERSION} (pip install deepspeed=={EXPECTED_DEEPSPEED_VERSION})",
                           versions)
    return CheckResult("versions", OK, text, versions)


def check_accelerator(probe: Probe) -> CheckResult:
    facts = probe.facts()
    if "accelerator" not in facts:
        reason = facts.get("accelerator_error") or facts.get("import_error") or probe.crash_text()
        return CheckResult("accelerator", FAIL, f"deepspeed.accelerator.get_accelerator() failed: {reason}")
    accel = facts["accelerator"]
    text = (f"{accel['device_name']} (DeepSpeed accelerator '{accel['name']}', {accel['device_count']} device(s), "
            f"comm backend {accel['communication_backend']})")
    return CheckResult("accelerator", OK, text, accel)


def check_async_io(probe: Probe) -> CheckResult:
    facts = probe.facts()
    forced = " [forced by TENCACHE_DOCTOR_FORCE_NO_AIO=1]" if probe.forced_no_aio else ""
    details = {key: facts.get(key) for key in ("aio_compatible", "aio_loaded", "aio_module", "aio_load_error",
                                               "aio_compatible_s", "aio_load_s")}
    details["forced_missing"] = probe.forced_no_aio
    if probe.skip_aio_reason:
        return CheckResult("async_io op", FAIL, f"not loaded: {probe.skip_aio_reason}", details)
    if "aio_compatible" not in facts or (facts["timed_out"] and not facts.get("aio_loaded")):
        reason = facts.get("import_error") or probe.crash_text()
        if facts["timed_out"]:
            reason += (" (a first JIT build of async_io takes minutes: build it once with `python -c \"from "
                       "deepspeed.ops.op_builder import AsyncIOBuilder; AsyncIOBuilder().load()\"`, then rerun)")
        return CheckResult("async_io op", FAIL, f"could not check DeepSpeed's async_io op: {reason}{forced}", details)
    if not facts["aio_compatible"]:
        extra = f" ({facts['aio_compatible_error']})" if facts.get("aio_compatible_error") else ""
        return CheckResult("async_io op", FAIL,
                           "DeepSpeed's async_io op is not compatible: its link test against libaio (io_submit) "
                           f"failed{extra}; install libaio-dev (apt-get install libaio-dev / yum install "
                           f"libaio-devel) or point CFLAGS/LDFLAGS at libaio{forced}", details)
    if not facts.get("aio_loaded"):
        reason = facts.get("aio_load_error") or probe.crash_text()
        return CheckResult("async_io op", FAIL, f"DeepSpeed's async_io op does not load: {reason[:300]}{forced}",
                           details)
    return CheckResult("async_io op", OK, f"loads ({facts['aio_module']}, {facts.get('aio_load_s', 0):.1f} s)", details)


def check_build_locks(probe: Probe) -> CheckResult:
    """Stale `lock` files in torch's extension cache (ext_lock.py has the rule), looked for after the probe, so a
    build the probe did finishes first and one it left when killed is already removed."""
    root = probe.extensions_root
    stale = ext_lock.find_stale_locks(root)
    removed = probe.facts()["removed_build_locks"]
    details = {"extensions_root": root, "stale": [dataclasses.asdict(lock) for lock in stale],
               "removed_after_probe_timeout": removed}
    if stale:
        return CheckResult("ext build lock", FAIL, f"torch extension build lock: {len(stale)} stale: "
                           + "; ".join(lock.describe() for lock in stale), details)
    text = f"torch extension build lock: none stale in {root}"
    if removed:
        text += f" (removed the one(s) the timed-out probe left: {', '.join(removed)})"
    return CheckResult("ext build lock", OK, text, details)


# ----------------------------------------------------------------------------------------------------------------
# Checks done in this process
# ----------------------------------------------------------------------------------------------------------------
def check_libaio() -> CheckResult:
    import ctypes.util
    library = ctypes.util.find_library("aio")
    header = "/usr/include/libaio.h"
    has_header = os.path.exists(header)
    details = {"library": library, "header": header if has_header else None}
    if library is None:
        return CheckResult("libaio", FAIL, "libaio not found (ctypes.util.find_library('aio')); install it: "
                           "apt-get install libaio-dev (Debian/Ubuntu), yum install libaio-devel (RHEL)", details)
    if not has_header:
        return CheckResult("libaio", WARN, f"{library} found but {header} is missing; DeepSpeed needs it to build "
                           "async_io: apt-get install libaio-dev", details)
    return CheckResult("libaio", OK, f"{library}, {header}", details)


def check_native_arena() -> CheckResult:
    try:
        from ..memory import native_available, native_unavailable_reason
    except ImportError as err:
        return CheckResult("native arena", FAIL, f"cannot import tencache_ds.memory: {err}")
    if native_available():
        return CheckResult("native arena", OK, "native pinned arena loads", {"native": True})
    reason = native_unavailable_reason() or "it does not load"
    # There is no pure-Python arena: a run with an enabled "tencache" block cannot start without this library.
    remedy = "" if "pip install -e ." in reason else "; reinstall the package: `pip install -e .` builds csrc/"
    return CheckResult("native arena", FAIL, f"the native pinned arena is unavailable, and tencache_ds has no other "
                       f"arena, so a run with an enabled \"tencache\" block would fail: {reason}{remedy}",
                       {"native": False, "reason": reason})


def check_memlock() -> CheckResult:
    """The soft RLIMIT_MEMLOCK as `ulimit -l` shows it, and whether CAP_IPC_LOCK makes it moot (root in most
    containers). plan/budget.py's memlock_limit_bytes() already folds the capability in, so read the raw limit here."""
    import resource
    from ..probes.limits import has_ipc_lock_capability
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    capable = has_ipc_lock_capability()
    unlimited = soft == resource.RLIM_INFINITY
    details = {"soft_limit_bytes": None if unlimited else soft,
               "hard_limit_bytes": None if hard == resource.RLIM_INFINITY else hard, "cap_ipc_lock": capable}
    if unlimited:
        return CheckResult("memlock", OK, "unlimited (ulimit -l)", details)
    if soft >= MIN_MEMLOCK_BYTES:
        return CheckResult("memlock", OK, f"{fmt_bytes(soft)} (ulimit -l)", details)
    if capable:
        return CheckResult("memlock", OK, f"{fmt_bytes(soft)} (ulimit -l), but this process has CAP_IPC_LOCK, so "
                           "the limit does not apply (a run without that capability would be held to it)", details)
    return CheckResult("memlock", WARN, f"{fmt_bytes(soft)} (ulimit -l) is below {fmt_bytes(MIN_MEMLOCK_BYTES)}: "
                       "pinned buffers beyond it cannot be locked and \"auto\" host budgets are capped at it; raise "
                       "it: `ulimit -l unlimited` in the launching shell, '* - memlock unlimited' in "
                       "/etc/security/limits.conf, or `docker run --ulimit memlock=-1`", details)


def describe_host() -> Dict[str, Any]:
    """RAM, CPU brand and core counts (py-cpuinfo brand; psutil counts)."""
    import psutil
    memory = psutil.virtual_memory()
    brand = None
    try:
        import cpuinfo
        brand = cpuinfo.get_cpu_info().get("brand_raw")
    except Exception:  # py-cpuinfo can fail on unusual /proc/cpuinfo; the brand is cosmetic
        pass
    return {"cpu_brand": brand or platform.processor() or "unknown", "logical_cores": psutil.cpu_count(logical=True),
            "physical_cores": psutil.cpu_count(logical=False), "ram_total_bytes": memory.total,
            "ram_available_bytes": memory.available}


def check_host(host: Dict[str, Any]) -> CheckResult:
    text = (f"{fmt_bytes(host['ram_total_bytes'])} RAM ({fmt_bytes(host['ram_available_bytes'])} available); "
            f"{host['cpu_brand']}, {host['logical_cores']} logical / {host['physical_cores']} physical cores")
    return CheckResult("host", OK, text, host)


def probe_gpus() -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """NVIDIA GPUs through NVML: ([{index, name, total_bytes, free_bytes}], why none were listed or None)."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return [], f"no NVIDIA driver ({err})"
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            device = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(device)
            memory = pynvml.nvmlDeviceGetMemoryInfo(device)
            gpus.append({"index": index, "name": name.decode() if isinstance(name, bytes) else name,
                         "total_bytes": int(memory.total), "free_bytes": int(memory.free)})
        return gpus, None if gpus else "NVML sees no devices"
    except pynvml.NVMLError as err:
        return [], f"NVML query failed ({err})"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def check_gpus(gpus: List[Dict[str, Any]], why_none: Optional[str]) -> CheckResult:
    if not gpus:
        return CheckResult("gpus", OK, f"none ({why_none}); DeepSpeed runs on its CPU accelerator", {"gpus": []})
    text = "; ".join(f"{gpu['index']}: {gpu['name']}, {fmt_bytes(gpu['free_bytes'])} free of "
                     f"{fmt_bytes(gpu['total_bytes'])}" for gpu in gpus)
    return CheckResult("gpus", OK, text, {"gpus": gpus})


# ----------------------------------------------------------------------------------------------------------------
# The NVMe path
# ----------------------------------------------------------------------------------------------------------------
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
    path = os.path.abspath(os.path.expanduser(path))
    state = NvmePathState(path, [])
    fix = "choose a folder on a local SSD/NVMe that this user can write, with --nvme-path"
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


def aio_skip_reason() -> Optional[str]:
    """Why the probe must not load async_io (a stale lock of its build folder, which it would wait on until its
    timeout), or None."""
    aio_locks = ext_lock.find_stale_locks(ops=[AIO_OP])
    if not aio_locks:
        return None
    return (f"its build lock {aio_locks[0].path} is stale, so loading it would wait forever (see the ext build lock "
            f"line); remedy: {aio_locks[0].remedy}, then rerun")


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


# ----------------------------------------------------------------------------------------------------------------
# Config and budgets
# ----------------------------------------------------------------------------------------------------------------
def load_ds_config(path: Optional[str]) -> Tuple[Optional[Dict[str, Any]], Optional[CheckResult]]:
    """(the ds_config dict or None, a FAIL result when it cannot be read)."""
    if path is None:
        return None, None
    try:
        with open(path) as fh:
            config = json.load(fh)
    except OSError as err:
        return None, CheckResult("config", FAIL, f"cannot read {path}: {err.strerror or err}")
    except json.JSONDecodeError as err:
        return None, CheckResult("config", FAIL, f"{path} is not valid JSON: {err}")
    if not isinstance(config, dict):
        return None, CheckResult("config", FAIL, f"{path} holds a {type(config).__name__}, not a JSON object")
    return config, CheckResult("config", OK, f"{path}: {'has a' if 'tencache' in config else 'no'} \"tencache\" block")


def nvme_path_from_config(config: Optional[Dict[str, Any]]) -> Optional[str]:
    zero = (config or {}).get("zero_optimization") or {}
    for section in ("offload_param", "offload_optimizer"):
        block = zero.get(section) or {}
        if isinstance(block, dict) and block.get("device") == "nvme" and block.get("nvme_path"):
            return str(block["nvme_path"])
    return None


def check_budgets(config: Optional[Dict[str, Any]], device_free_bytes: int) -> CheckResult:
    from ..config import CONFIG_KEY, config_of_ds_dict, parse_config
    from ..errors import TencacheConfigError
    from ..plan.budget import UNLIMITED, MachineResources, resolve_budgets
    origin = "the config's \"tencache\" block" if config is not None and CONFIG_KEY in config else "defaults"
    try:  # no block (or "tencache": null): the budgets the defaults give
        parsed = config_of_ds_dict(config) if (config or {}).get(CONFIG_KEY) is not None else parse_config({})
    except TencacheConfigError as err:
        return CheckResult("budgets", FAIL, str(err).replace("\n", " "))
    machine = MachineResources.probe(device_free_bytes=device_free_bytes)
    budgets = resolve_budgets(parsed, machine, stream_min_bytes=0)  # no model here: no streaming slots yet
    details = dataclasses.asdict(budgets)
    details.update(machine=dataclasses.asdict(machine), origin=origin, enabled=parsed.enabled)
    memlock = ("unlimited for this process" if machine.memlock_limit_bytes == UNLIMITED
               else fmt_bytes(machine.memlock_limit_bytes))
    text = (f"host_cache_bytes={budgets.host_cache_bytes} ({fmt_bytes(budgets.host_cache_bytes)}, "
            f"{budgets.host_source}), device_cache_bytes={budgets.device_cache_bytes} "
            f"({fmt_bytes(budgets.device_cache_bytes)}, {budgets.device_source}) from {origin}; host available "
            f"{fmt_bytes(machine.host_available_bytes)}{_cgroup_note(machine)}, memlock {memlock}, device free "
            f"{fmt_bytes(machine.device_free_bytes)}")
    if not parsed.enabled:
        text += "; the block has enabled=false, so the run would be stock DeepSpeed"
    return CheckResult("budgets", OK, text, details)


def _cgroup_note(machine) -> str:
    """Where a container's memory cgroup bounds the host memory, say so (its limit is what "auto" shares)."""
    if machine.host_bound_by == "node":
        return ""
    return f" of {fmt_bytes(machine.host_total_bytes)} (the limit of memory cgroup {machine.host_bound_by})"


# ----------------------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------------------
def run_checks(nvme_path: Optional[str] = None, config_path: Optional[str] = None,
               probe_timeout_s: float = PROBE_TIMEOUT_S) -> List[CheckResult]:
    """All checks, in report order. Never raises for a machine problem; each becomes a FAIL or WARN line."""
    config, config_check = load_ds_config(config_path)
    if nvme_path is not None:
        path, source = nvme_path, "--nvme-path"
    elif nvme_path_from_config(config):
        path, source = nvme_path_from_config(config), f"nvme_path in {config_path}"
    else:
        path, source = DEFAULT_NVME_PATH, "default"
    state = check_nvme_path(path, source)
    try:
        measure_here = state.usable and state.enough_space_for_bandwidth
        probe = Probe(want_aio=True, bandwidth_dir=state.path if measure_here else None,
                      bandwidth_bytes=BANDWIDTH_FILE_BYTES, timeout_s=probe_timeout_s,
                      skip_aio_reason=aio_skip_reason())
        # These run while the probe imports torch and DeepSpeed.
        libaio = check_libaio()
        native = check_native_arena()
        memlock = check_memlock()
        host = check_host(describe_host())
        gpus, why_none = probe_gpus()
        gpu_check = check_gpus(gpus, why_none)
        budgets = check_budgets(config, gpus[0]["free_bytes"] if gpus else 0) if config_check is None or \
            config_check.status != FAIL else CheckResult("budgets", FAIL, "not resolved: the config cannot be read")

        facts = probe.facts()
        if not state.usable:
            bandwidth = bandwidth_check(None, "the NVMe path is unusable (see above)")
        elif not state.enough_space_for_bandwidth:
            bandwidth = bandwidth_check(None, f"less than {fmt_bytes(2 * BANDWIDTH_FILE_BYTES)} free")
        else:
            # Without the probe's aio measurement (the aio op is unusable; its own line says why): plain file I/O.
            try:
                measurement, aio_error = nvme_bandwidth(state.path, facts)
                bandwidth = bandwidth_check(measurement, None)
                if aio_error:
                    bandwidth.message += f" [aio measurement failed: {aio_error[:200]}]"
            except OSError as err:
                bandwidth = CheckResult("nvme bandwidth", FAIL, f"sequential I/O in {state.path} failed: {err}")
    finally:
        state.cleanup()
    checks = [check_versions(probe), check_accelerator(probe), libaio, check_async_io(probe),
              check_build_locks(probe), native, memlock, host, gpu_check]
    if config_check is not None:
        checks.append(config_check)
    checks += state.checks + [bandwidth, budgets]
    return checks


def render(checks: Sequence[CheckResult], elapsed_s: float) -> str:
    counts = {status: sum(check.status == status for check in checks) for status in STATUS_ORDER}
    lines = [check.line() for check in checks]
    lines.append(f"doctor: {counts[OK]} OK, {counts[WARN]} WARN, {counts[FAIL]} FAIL ({elapsed_s:.1f} s)")
    return "\n".join(lines)


def run(args) -> int:
    """`tencache-ds doctor`. Exit code 1 when any check FAILs, else 0."""
    started = time.perf_counter()
    # Keep stdout for the report alone (a library may print while we check).
    with contextlib.redirect_stdout(sys.stderr):
        checks = run_checks(nvme_path=args.nvme_path, config_path=args.config)
    elapsed_s = time.perf_counter() - started
    if args.json:
        print(json.dumps([check.to_dict() for check in checks], indent=1, default=str))
    else:
        print(render(checks, elapsed_s))
    return 1 if any(check.status == FAIL for check in checks) else 0
