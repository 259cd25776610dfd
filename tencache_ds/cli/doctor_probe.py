"""`tencache-ds doctor`'s probe: a child process that imports torch and DeepSpeed. Owns: starting it, what it
measures (versions, the accelerator, loading DeepSpeed's async_io op, DeepSpeed aio's sequential bandwidth, the
drive as tencache's own engine uses it) and collecting its facts; why the async_io op must not be loaded
(aio_skip_reason). Does not own: the checks that read the facts (cli/doctor_checks.py).

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
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, Optional, Sequence, Tuple

from .. import ext_lock
from ..io.drive_rate import remove_stale_trial_files
from ..units import fmt_bytes
from .doctor_nvme import BANDWIDTH_CHUNK_BYTES, _timed_write_then_read

FORCE_NO_AIO_ENV = "TENCACHE_DOCTOR_FORCE_NO_AIO"
MISSING_COMPILER = "/nonexistent/tencache-doctor-forced-no-aio/cc"
PROBE_TIMEOUT_S = 180.0            # a first JIT build of async_io takes 1-2 minutes on 2 cores
PROBE_MARKER = "TENCACHE_DOCTOR_PROBE "
AIO_OP = "async_io"                # DeepSpeed's op name = its build folder in torch's extension cache


def _emit(**facts: Any) -> None:
    """Report facts to the parent as they are learned, so a crash later still leaves the earlier ones."""
    sys.stdout.write(PROBE_MARKER + json.dumps(facts) + "\n")
    sys.stdout.flush()


def _probe_main(argv: Sequence[str]) -> None:
    """Entry point of the probe process. argv: [--aio] [--bandwidth-dir DIR --bandwidth-bytes N]
    [--drive-dir DIR --drive-threads N,M]."""
    args = list(argv)
    want_aio = "--aio" in args
    bandwidth_dir = args[args.index("--bandwidth-dir") + 1] if "--bandwidth-dir" in args else None
    bandwidth_bytes = int(args[args.index("--bandwidth-bytes") + 1]) if "--bandwidth-bytes" in args else 0
    drive_dir = args[args.index("--drive-dir") + 1] if "--drive-dir" in args else None
    drive_threads = (tuple(int(count) for count in args[args.index("--drive-threads") + 1].split(","))
                     if "--drive-threads" in args else None)
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
    if drive_dir:  # before async_io, whose first build may outlast the probe's timeout
        from ..io.drive_rate import THREAD_COUNTS, measure_drive
        try:
            _emit(drive=measure_drive(drive_dir, thread_counts=drive_threads or THREAD_COUNTS).to_dict())
        except Exception as err:  # reported as the check's WARN line, or as the bench's missing bound
            _emit(drive_error=f"{type(err).__name__}: {err}")
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
                 timeout_s: float = PROBE_TIMEOUT_S, skip_aio_reason: Optional[str] = None,
                 drive_dir: Optional[str] = None, drive_threads: Optional[Sequence[int]] = None):
        """``drive_dir``: measure the drive there as tencache's engine uses it (io/drive_rate.py), with
        ``drive_threads`` requests in flight (default: its THREAD_COUNTS)."""
        env, self.forced_no_aio = _probe_env()
        self.skip_aio_reason = skip_aio_reason  # why async_io is not loaded although it was wanted
        want_aio = want_aio and skip_aio_reason is None
        argv = ["--aio"] if want_aio else []
        if bandwidth_dir:
            argv += ["--bandwidth-dir", bandwidth_dir, "--bandwidth-bytes", str(bandwidth_bytes)]
        if drive_dir:
            argv += ["--drive-dir", drive_dir]
            if drive_threads:
                argv += ["--drive-threads", ",".join(map(str, drive_threads))]
        self._drive_dir = drive_dir
        code = "import sys; from tencache_ds.cli.doctor_probe import _probe_main; _probe_main(sys.argv[1:])"
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
        if self._drive_dir:  # io/drive_rate.py's files, likewise: the probe has ended, so its files are stale
            with contextlib.suppress(OSError):
                remove_stale_trial_files(self._drive_dir)
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

    def stop(self) -> None:
        """Kill the probe if it still runs (its process group and session, the build locks it left removed, as
        after a timeout): whoever started it was interrupted, and a probe left running measured the drive beside the
        next bench's (helper-215)."""
        if self._process.poll() is not None:
            return
        new_locks = set(ext_lock.find_locks(self.extensions_root)) - self._locks_before
        ours = ext_lock.locks_used_by_session(self._process.pid, sorted(new_locks))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, 9)
        ext_lock.kill_session(self._process.pid)
        self._process.wait()
        ext_lock.remove_abandoned_locks(ours)
        if self._drive_dir:
            with contextlib.suppress(OSError):
                remove_stale_trial_files(self._drive_dir)

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


def aio_skip_reason() -> Optional[str]:
    """Why the probe must not load async_io (a stale lock of its build folder, which it would wait on until its
    timeout), or None."""
    aio_locks = ext_lock.find_stale_locks(ops=[AIO_OP])
    if not aio_locks:
        return None
    return (f"its build lock {aio_locks[0].path} is stale, so loading it would wait forever (see the ext build lock "
            f"line); remedy: {aio_locks[0].remedy}, then rerun")

