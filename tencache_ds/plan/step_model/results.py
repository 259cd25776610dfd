"""What a policy's replayed step comes to: the Prediction record, whether it fits the machine's memory, and how
long the drives last at its write rate. Pure."""
import dataclasses
from typing import Dict, List, Optional, Tuple

from ...drive_wear import days_to_rated_tbw
from ...units import fmt_bytes
from ..machine import Machine
from ..workload import Workload

STOCK, TENCACHE = "stock", "tencache"
# What a replayed step's time is made of (step_model/timeline.py charges each wait or piece of work to one of them);
# "collective": stage 3's all-gathers and reduce-scatters between ranks (step_model/costs.py)
CRITICAL_PARTS = ("compute", "collective", "h2d", "nvme_read", "nvme_write", "cpu_adam")


@dataclasses.dataclass
class Prediction:
    """What one policy's step looks like on one rank (bytes per step, per rank; memory per rank)."""

    policy: str
    step_time_s: float
    critical_path_s: Dict[str, float]   # CRITICAL_PARTS: the step is their sum
    bottleneck: str
    nvme_read_bytes: int
    nvme_write_bytes: int
    h2d_bytes: int
    memory: Dict[str, int]              # device, pinned, pageable (host), nvme
    device_hit_rate: Optional[float]
    host_hit_rate: Optional[float]
    failures: List[str]                  # why it would not run ("" list: it runs)
    budgets: Dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def host_bytes(self) -> int:
        return self.memory["pinned"] + self.memory["pageable"]

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["host_bytes"] = self.host_bytes
        return out


def finish(policy, step_s, parts, moved, memory, device_rate, host_rate, failures, budgets) -> Prediction:
    unknown = set(parts) - set(CRITICAL_PARTS)
    if unknown:  # a part no report would show: the critical path would no longer add up to the step
        raise ValueError(f"step parts {sorted(unknown)} are not in CRITICAL_PARTS")
    critical = {name: parts.get(name, 0.0) for name in CRITICAL_PARTS}
    bottleneck = max(critical, key=critical.get) if step_s > 0 else "compute"
    return Prediction(policy, step_s, critical, bottleneck, int(moved.get("nvme_read", 0)),
                      int(moved.get("nvme_write", 0)), int(moved.get("h2d", 0)), memory, device_rate, host_rate,
                      list(failures), budgets)


def fits(prediction: Prediction, workload: Workload, machine: Machine) -> Tuple[bool, List[str]]:
    """Whether one rank's (and a node's) memory holds what the prediction needs, with the reasons when not."""
    reasons = list(prediction.failures)
    if not machine.accelerator_is_host and prediction.memory["device"] > machine.accelerator_memory_bytes:
        # (in the binary units of the report's memory lines beside it; --json keeps the bytes: helper-244)
        reasons.append(f"accelerator memory: needs {fmt_bytes(prediction.memory['device'])} per rank, has "
                       f"{fmt_bytes(machine.accelerator_memory_bytes)}")
    node_host = prediction.host_bytes * machine.ranks_per_node
    if node_host > machine.available_host_bytes:
        reasons.append(f"host memory: the node's {machine.ranks_per_node} rank(s) need {fmt_bytes(node_host)}, "
                       f"{fmt_bytes(machine.available_host_bytes)} available")
    node_files = prediction.memory.get("nvme", 0) * machine.ranks_per_node
    if machine.nvme_free_bytes is not None and node_files > machine.nvme_free_bytes:  # (helper-176: not checked)
        reasons.append(f"NVMe space: the node's {machine.ranks_per_node} rank(s) write {fmt_bytes(node_files)} of "
                       f"swap files, {fmt_bytes(machine.nvme_free_bytes)} free where they go")
    return not reasons, reasons


def drive_days_to_tbw(prediction: Prediction, machine: Machine, drive_tbw_bytes: Optional[float]) -> Optional[float]:
    """Days of continuous training until each drive has absorbed its rated TBW at this step's write rate (the
    node's ranks write to the node's drives, evenly); None without a rating or a positive step time, inf when
    nothing is written."""
    return days_to_rated_tbw(prediction.nvme_write_bytes, prediction.step_time_s, drive_tbw_bytes,
                             machine.ranks_per_node / max(1, machine.drives))
