"""`tencache-ds doctor`'s checks other than the NVMe path's. Owns: a check's result (CheckResult, OK/WARN/FAIL),
the checks that read the probe's facts (versions, accelerator, async_io, build locks), the checks done in the
doctor's own process (libaio, the native arena, memlock, host, GPUs) and the config and the budgets "auto" resolves
to. Does not own: the probe (cli/doctor_probe.py), the NVMe path (cli/doctor_nvme.py) or the report
(cli/doctor.py)."""
import contextlib
import dataclasses
import os
import platform
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from .. import ext_lock
from ..errors import TencacheConfigError, TencacheResourceError
from ..supported_deepspeed import TESTED_VERSION, version_problem
from ..units import fmt_bytes
from .ds_config_file import read_ds_config

if TYPE_CHECKING:
    from .doctor_probe import Probe

OK, WARN, FAIL = "OK", "WARN", "FAIL"
STATUS_ORDER = (OK, WARN, FAIL)

MIN_MEMLOCK_BYTES = 1 << 30        # 1 GiB: below this, stock DeepSpeed's default pinned pools already do not fit


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
# Checks that read the probe's facts
# ----------------------------------------------------------------------------------------------------------------
def check_versions(probe: "Probe") -> CheckResult:
    facts = probe.facts()
    python = platform.python_version()
    if "versions" not in facts:
        reason = facts.get("import_error") or probe.crash_text()
        return CheckResult("versions", FAIL, f"could not read the torch/deepspeed versions: {reason}",
                           {"python": python})
    versions = dict(facts["versions"], python=python)
    text = f"python {python}, torch {versions['torch']}, deepspeed {versions['deepspeed']}"
    problem = version_problem(versions["deepspeed"])
    if problem is not None:  # deepspeed.initialize refuses it (before 2026-12-07 a WARN, doctor's exit 0: helper-206)
        return CheckResult("versions", FAIL, f"{text}; {problem}", versions)
    if versions["deepspeed"] != TESTED_VERSION:
        return CheckResult("versions", WARN, f"{text}; tencache_ds is tested with deepspeed {TESTED_VERSION} "
                           f"(pip install deepspeed=={TESTED_VERSION})", versions)
    return CheckResult("versions", OK, text, versions)


def check_accelerator(probe: "Probe", gpus: Sequence[dict] = ()) -> CheckResult:
    """DeepSpeed's accelerator; ``gpus``: what NVML sees. GPUs there and DeepSpeed on its CPU accelerator is a torch
    that cannot use them (a CPU build, or a CUDA build newer than the driver): the run trains on the CPU, DeepSpeed
    saying so in a log line only (helper-231: doctor said OK)."""
    facts = probe.facts()
    if "accelerator" not in facts:
        reason = facts.get("accelerator_error") or facts.get("import_error") or probe.crash_text()
        return CheckResult("accelerator", FAIL, f"deepspeed.accelerator.get_accelerator() failed: {reason}")
    accel = facts["accelerator"]
    text = (f"{accel['device_name']} (DeepSpeed accelerator '{accel['name']}', {accel['device_count']} device(s), "
            f"comm backend {accel['communication_backend']})")
    hidden = os.environ.get("DS_ACCELERATOR") == "cpu" or os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1")
    if accel["device_name"] == "cpu" and gpus and hidden:  # on purpose (helper-232: the warning's advice was wrong)
        return CheckResult("accelerator", OK, text + f" (NVML's {len(gpus)} GPU(s) hidden from it by DS_ACCELERATOR "
                           "or CUDA_VISIBLE_DEVICES)", accel)
    if accel["device_name"] == "cpu" and gpus:
        return CheckResult("accelerator", WARN, text + f", though NVML sees {len(gpus)} GPU(s): this torch cannot use "
                           "them (torch.cuda.is_available() is False: a CPU build, or a CUDA build newer than the "
                           "driver). Training would run on the CPU: install the torch build for this driver's CUDA "
                           "(pytorch.org lists an index per CUDA version)", accel)
    return CheckResult("accelerator", OK, text, accel)


def check_async_io(probe: "Probe") -> CheckResult:
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


def check_build_locks(probe: "Probe") -> CheckResult:
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


def check_memlock(accelerator_is_host: bool = False) -> CheckResult:
    """The soft RLIMIT_MEMLOCK as `ulimit -l` shows it, and whether CAP_IPC_LOCK makes it moot (root in most
    containers). plan/budget.py's memlock_limit_bytes() already folds the capability in, so read the raw limit here.
    ``accelerator_is_host``: DeepSpeed's CPU accelerator, where "best_effort" locks nothing (a low limit is OK)."""
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
    if accelerator_is_host:
        return CheckResult("memlock", OK, f"{fmt_bytes(soft)} (ulimit -l): enough on the CPU accelerator, where "
                           "nothing is locked unless \"pin_memory\" is \"required\"", details)
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
# Config and budgets
# ----------------------------------------------------------------------------------------------------------------
def load_ds_config(path: Optional[str]) -> Tuple[Optional[Dict[str, Any]], Optional[CheckResult]]:
    """(the ds_config dict or None, a FAIL result when it cannot be read)."""
    if path is None:
        return None, None
    from ..preflight import checked_block
    from ..zero_sections import deepspeed_refusal
    try:
        config = read_ds_config(path)
    except TencacheConfigError as err:
        return None, CheckResult("config", FAIL, str(err))
    try:  # what the run refuses at initialize before writing anything (its budget: the budgets line below)
        checked_block(config)
    except (TencacheConfigError, TencacheResourceError) as err:
        return config, CheckResult("config", FAIL, f"{path}: " + str(err).replace("\n", " "))
    refused = deepspeed_refusal(config)  # DeepSpeed's own models' (a misspelt key passed as OK: helper-244)
    if refused is not None:
        return config, CheckResult("config", FAIL, f"{path}: {refused}")
    return config, CheckResult("config", OK, f"{path}: {'has a' if 'tencache' in config else 'no'} \"tencache\" block")


def nvme_paths_from_config(config: Optional[Dict[str, Any]]) -> Dict[str, str]:
    """{"zero_optimization.<section>.nvme_path": path} of each offload section on NVMe, parameters first."""
    zero = (config or {}).get("zero_optimization") or {}
    if not isinstance(zero, dict):  # DeepSpeed's older "zero_optimization": true has no offload section
        return {}
    paths = {}
    for section in ("offload_param", "offload_optimizer"):
        block = zero.get(section) or {}
        if isinstance(block, dict) and block.get("device") == "nvme" and block.get("nvme_path"):
            paths[f"zero_optimization.{section}.nvme_path"] = str(block["nvme_path"])
    return paths


def nvme_path_from_config(config: Optional[Dict[str, Any]]) -> Optional[str]:
    """The first of ``nvme_paths_from_config`` (the parameters', else the optimizer's), or None."""
    return next(iter(nvme_paths_from_config(config).values()), None)


def local_ranks(gpu_count: int) -> int:
    """The ranks a run starts on this node when doctor is not told (``--ranks``): what a launcher said, as the run
    reads it (LOCAL_WORLD_SIZE, MPI's and Slurm's variables: probes/limits.py), else one per GPU the launcher would
    start on (those CUDA_VISIBLE_DEVICES leaves, where set: DeepSpeed's launcher honours it; NVML's count ignores
    it), else 1 (helper-245's review)."""
    from ..probes.limits import told_ranks_on_node
    told = told_ranks_on_node()
    if told is not None:
        return told
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpu_count = min(gpu_count, len([device for device in visible.split(",") if device.strip()]))
    return max(1, gpu_count)


def check_budgets(config: Optional[Dict[str, Any]], device_free_bytes: int, accelerator_is_host: bool,
                  ranks: int = 1) -> CheckResult:
    """The budgets the config's block resolves to here, per rank of ``ranks`` on this node (``accelerator_is_host``:
    DeepSpeed runs on its CPU accelerator, where "best_effort" locks no parameter slot and the memlock limit bounds
    nothing). Checked for one rank, a budget two ranks cannot hold passed (helper-244's review)."""
    from ..config import CONFIG_KEY, config_of_ds_dict, parse_config
    from ..config_checks import check_host_budget
    from ..plan.budget import UNLIMITED, MachineResources, parameter_lock_mode, resolve_budgets
    origin = "the config's \"tencache\" block" if config is not None and CONFIG_KEY in config else "defaults"
    try:  # no block (or "tencache": null): the budgets the defaults give
        parsed = config_of_ds_dict(config) if (config or {}).get(CONFIG_KEY) is not None else parse_config({})
    except TencacheConfigError as err:
        return CheckResult("budgets", FAIL, str(err).replace("\n", " "))
    # (said, not guessed: a guess from WORLD_SIZE is judged as one rank, config_checks.check_host_budget)
    machine = dataclasses.replace(MachineResources.probe(device_free_bytes=device_free_bytes),
                                  local_world_size=max(1, ranks), local_world_size_guessed=False)
    try:  # what the run refuses at initialize (a budget above the node's memory, say): a failure here too
        if parsed.enabled:  # (a disabled block is stock DeepSpeed's run, which checks nothing of it)
            check_host_budget(parsed, machine)
    except (TencacheConfigError, TencacheResourceError) as err:
        return CheckResult("budgets", FAIL, str(err))
    locks_memory = parameter_lock_mode(parsed.pin_memory, accelerator_is_host) != "off"
    # no model here: no streaming slots yet
    budgets = resolve_budgets(parsed, machine, stream_min_bytes=0, locks_memory=locks_memory)
    details = dataclasses.asdict(budgets)
    details.update(machine=dataclasses.asdict(machine), origin=origin, enabled=parsed.enabled, ranks=ranks,
                   parameter_slots_locked=locks_memory)
    memlock = ("not used (CPU accelerator: no slot is locked)" if not locks_memory
               else "unlimited for this process" if machine.memlock_limit_bytes == UNLIMITED
               else fmt_bytes(machine.memlock_limit_bytes))
    text = (f"host_cache_bytes={budgets.host_cache_bytes} ({fmt_bytes(budgets.host_cache_bytes)}, "
            f"{budgets.host_source}), device_cache_bytes={budgets.device_cache_bytes} "
            f"({fmt_bytes(budgets.device_cache_bytes)}, {budgets.device_source}) from {origin}, per rank of "
            f"{machine.local_world_size} on this node; host available "
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
