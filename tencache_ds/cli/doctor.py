"""`tencache-ds doctor`: is this machine ready for ZeRO-Infinity with tencache_ds? Owns: the environment checks
(versions, accelerator, libaio, DeepSpeed's async_io op, the native arena, memlock, host, GPUs, the NVMe path and its
bandwidth, what "auto" budgets resolve to) and their report, one OK/WARN/FAIL line each. Does not own: budget
arithmetic (plan/budget.py) or the arena (memory/).

The doctor is spread over four modules by section: cli/doctor_probe.py (the child process that imports torch and
DeepSpeed), cli/doctor_checks.py (CheckResult and the checks other than the NVMe path's), cli/doctor_nvme.py (the
NVMe path) and this one (the command: the checks in report order, their text). Its public names are re-exported
here, so ``doctor.X`` keeps working.
"""
import contextlib
import json
import os
import sys
import time
from typing import List, Optional, Sequence

from ..io.drive_rate import store_thread_counts
from ..units import fmt_bytes
from .doctor_checks import (FAIL, MIN_MEMLOCK_BYTES, OK, STATUS_ORDER,  # noqa: F401
                            WARN, CheckResult, check_accelerator, check_async_io, check_budgets, check_build_locks,
                            check_gpus, check_host, check_libaio, check_memlock, check_native_arena, check_versions,
                            describe_host, load_ds_config, local_ranks, nvme_path_from_config, nvme_paths_from_config,
                            probe_gpus)
from .doctor_nvme import (BANDWIDTH_FILE_BYTES, MIN_NVME_FREE_BYTES, NvmePathState, bandwidth_check,  # noqa: F401
                          bytes_per_s, check_nvme_path, drive_check, mount_of, nvme_bandwidth, plain_io_bandwidth)
from .doctor_probe import (AIO_OP, FORCE_NO_AIO_ENV, PROBE_TIMEOUT_S, Probe, _probe_main,  # noqa: F401
                           aio_skip_reason)
from .interrupts import interrupting_signals, restore_signals

DEFAULT_NVME_PATH = "/tmp/tencache-bench-nvme"  # also the default of `tencache-ds bench --nvme-path`


# ----------------------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------------------
def run_checks(nvme_path: Optional[str] = None, config_path: Optional[str] = None,
               probe_timeout_s: float = PROBE_TIMEOUT_S, ranks: Optional[int] = None) -> List[CheckResult]:
    """All checks, in report order. Never raises for a machine problem; each becomes a FAIL or WARN line.
    ``ranks``: the ranks the run starts on this node, whose budgets are checked per rank (None: LOCAL_WORLD_SIZE,
    else one per GPU, else 1)."""
    config, config_check = load_ds_config(config_path)
    if nvme_path is not None:
        path, source = nvme_path, "--nvme-path"
    elif nvme_path_from_config(config):
        path, source = nvme_path_from_config(config), f"nvme_path in {config_path}"
    else:
        path, source = DEFAULT_NVME_PATH, "default"
    state = check_nvme_path(path, source)
    probe = None
    try:
        measure_here = state.usable and state.enough_space_for_bandwidth
        probe = Probe(want_aio=True, bandwidth_dir=state.path if measure_here else None,
                      bandwidth_bytes=BANDWIDTH_FILE_BYTES, timeout_s=probe_timeout_s,
                      skip_aio_reason=aio_skip_reason(), drive_dir=state.path if measure_here else None,
                      drive_threads=store_thread_counts(config))
        # These run while the probe imports torch and DeepSpeed.
        libaio = check_libaio()
        native = check_native_arena()
        host = check_host(describe_host())
        gpus, why_none = probe_gpus()
        gpu_check = check_gpus(gpus, why_none)

        facts = probe.facts()
        # DeepSpeed's own choice of accelerator (DS_ACCELERATOR, XPU, ...) where the probe could make it
        device_name = (facts.get("accelerator") or {}).get("device_name")
        accelerator_is_host = device_name == "cpu" if device_name else not gpus
        memlock = check_memlock(accelerator_is_host)
        budgets = check_budgets(config, gpus[0]["free_bytes"] if gpus else 0, accelerator_is_host,
                                ranks or local_ranks(len(gpus))) \
            if config_path is None or config is not None else \
            CheckResult("budgets", FAIL, "not resolved: the config cannot be read")
        why_not = None
        if not state.usable:
            why_not = "the NVMe path is unusable (see above)"
        elif not state.enough_space_for_bandwidth:
            why_not = f"less than {fmt_bytes(2 * BANDWIDTH_FILE_BYTES)} free"
        drive = drive_check(facts, why_not)
        if why_not is not None:
            bandwidth = bandwidth_check(None, why_not)
        else:
            # Without the probe's aio measurement (the aio op is unusable; its own line says why): plain file I/O.
            try:
                measurement, aio_error = nvme_bandwidth(state.path, facts)
                bandwidth = bandwidth_check(measurement, None)
                if aio_error:
                    bandwidth.message += f" [aio measurement failed: {aio_error[:200]}]"
            except OSError as err:
                bandwidth = CheckResult("nvme bandwidth", FAIL, f"sequential I/O in {state.path} failed: {err}")
    except BaseException:  # (Ctrl-C, SIGTERM, a check that raised) the probe runs in a session of its own: stopped,
        if probe is not None:  # not left measuring the drive beside the next run (helper-231; the bench's rule)
            probe.stop()
        raise
    finally:
        state.cleanup()
    checks = [check_versions(probe), check_accelerator(probe, gpus), libaio, check_async_io(probe),
              check_build_locks(probe), native, memlock, host, gpu_check]
    if config_check is not None:
        checks.append(config_check)
    checks += state.checks + [bandwidth, drive, budgets]
    return checks + _other_nvme_paths(config, config_path, state.path if nvme_path is None else None)


def _other_nvme_paths(config, config_path: Optional[str], checked: Optional[str]) -> List[CheckResult]:
    """The checks of the config's other nvme_path (the optimizer's in a folder of its own, with most of the bytes:
    writable, free space, filesystem and O_DIRECT), where one was checked above; it went unchecked (helper-176)."""
    results = []
    for key, path in nvme_paths_from_config(config).items():
        if checked is None or os.path.abspath(path) == checked:
            continue
        other = check_nvme_path(path, f"{key} in {config_path}")
        try:
            results += other.checks
        finally:
            other.cleanup()
    return results


def render(checks: Sequence[CheckResult], elapsed_s: float) -> str:
    counts = {status: sum(check.status == status for check in checks) for status in STATUS_ORDER}
    lines = [check.line() for check in checks]
    lines.append(f"doctor: {counts[OK]} OK, {counts[WARN]} WARN, {counts[FAIL]} FAIL ({elapsed_s:.1f} s)")
    return "\n".join(lines)


def run(args) -> int:
    """`tencache-ds doctor`. Exit code 1 when any check FAILs, else 0."""
    started = time.perf_counter()
    # Keep stdout for the report alone (a library may print while we check). SIGTERM and SIGHUP take Ctrl-C's path.
    previous_handlers = interrupting_signals()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            checks = run_checks(nvme_path=args.nvme_path, config_path=args.config, ranks=getattr(args, "ranks", None))
    finally:
        restore_signals(previous_handlers)
    elapsed_s = time.perf_counter() - started
    if args.json:
        print(json.dumps([check.to_dict() for check in checks], indent=1, default=str))
    else:
        print(render(checks, elapsed_s))
    return 1 if any(check.status == FAIL for check in checks) else 0
