"""A machine as the step model sees it. Owns: the description's fields, their units, reading and checking a machine
file (configs/machines/*.json), and what one rank gets of a node's shared parts. Does not own: measuring this
machine (cli/calibrate.py) or the model (plan/step_model/). Pure.

A machine file is JSON; every figure is per node unless its name says otherwise, and ``sources`` says where each
came from (a datasheet, a paper, a measurement)::

    {"name": "1x H100 SXM, 2 Gen4 NVMe", "accelerator_memory_bytes": 85899345920,
     "accelerator_flops_per_s": 4.9e14, "h2d_bytes_per_s": 5.0e10, "host_memory_bytes": 274877906944,
     "nvme_read_bytes_per_s_per_drive": 6.9e9, "nvme_write_bytes_per_s_per_drive": 4.1e9, "drives": 2,
     "drive_tbw_bytes": 7.0e15, "cpu_adam_elements_per_s": 2.0e9, "ranks_per_node": 1, "nodes": 1,
     "sources": {"accelerator_flops_per_s": "...", ...}}

``accelerator_flops_per_s`` is what training sustains (peak x a published model-FLOPs utilisation), not the peak.
``accelerator_is_host``: DeepSpeed's CPU accelerator (no GPU): the device is host memory, compute and the CPU
optimizer share the same cores, and there is no H2D copy.
"""
import dataclasses
import json
import math
from typing import Any, Dict, Mapping, Optional, Tuple

from ..errors import TencacheConfigError
from ..units import finite

# the host memory a fresh process finds available, as a share of the total, when a file does not say (the kernel,
# page tables and daemons keep the rest; 0.9 is what a quiet Linux box with no other job reports)
DEFAULT_AVAILABLE_FRACTION = 0.9
# host memory the training process holds before any model state: Python, torch, DeepSpeed, the launcher's
# process group, allocator caches (a file may override it; `--machine this` measures it). On an H200 (the ninth
# lease, docs/estimate.md "On a GPU") a GPU process's floor came to about 1.9 GiB: gpt2-tiny's peaks less the
# model's other terms, in stock's run and tencache's alike
DEFAULT_PROCESS_BASELINE_BYTES = 2 << 30


class MachineFileError(TencacheConfigError):
    """A machine description that cannot be used; the message names the file and the key."""


@dataclasses.dataclass(frozen=True)
class Machine:
    """One node type, ``nodes`` of them, ``ranks_per_node`` training processes each (one per accelerator)."""

    name: str
    accelerator_memory_bytes: int
    accelerator_flops_per_s: float
    h2d_bytes_per_s: float
    host_memory_bytes: int
    nvme_read_bytes_per_s_per_drive: float
    nvme_write_bytes_per_s_per_drive: float
    drives: int
    cpu_adam_elements_per_s: float
    # Reads and writes in flight together, bytes per second in all, per drive. None: the drive serves both at once,
    # each at its own rate (a datasheet's sequential figures). Below twice the slower direction's rate, each
    # direction runs at a share of its rate while the other moves too (step_model/timeline.py, mixed_share).
    nvme_mixed_bytes_per_s_per_drive: Optional[float] = None
    # The drive's read and write rates at other request sizes, relative to the figures above: ((request bytes, read
    # factor, write factor), ...) by increasing size, 1.0 at the size those figures were measured at. A request of
    # a size in between is priced between its neighbours (by the logarithm of its size), one outside at the nearest.
    # Measured with tencache's engine (`--machine this`): on this VM 400 MiB requests read about 1.4x faster than
    # 64 MiB ones. None: one rate for every size (a datasheet's sequential figures).
    nvme_request_factors: Optional[Tuple[Tuple[int, float, float], ...]] = None
    # The drive's read, write and mixed rates into buffers of 4 KiB pages, relative to the figures above, which are
    # its rates into the stores' buffers (arena slots: huge pages). DeepSpeed's swap buffers are torch.empty memory
    # of 4 KiB pages, and O_DIRECT pins each page of a request: on this VM 64 MiB requests read 2.2x and wrote 1.7x
    # as fast into huge pages (io/drive_rate.py). The model's stock policy moves its bytes at these shares
    # (step_model/timeline.py, channel_rates). None: the same rates for both (a datasheet's figures).
    nvme_small_page_factors: Optional[Tuple[float, float, float]] = None
    host_copy_bytes_per_s: float = 1.0e10
    # Writing host memory the process has not touched yet (each page faulted in first). Only a host accelerator pays
    # it per step (step_model/costs.py, backward_host_memory_s); None leaves that term out (GPU boxes).
    host_fresh_write_bytes_per_s: Optional[float] = None
    # Seconds ZeRO-3's hooks add to each use of a submodule that owns parameters (its forward, or its backward),
    # beyond its FLOPs: the fetch and release bookkeeping in Python, with nothing to gather. Measured on a host
    # accelerator (`--machine this`), where the hooks run on the cores that compute; 0 leaves it out (GPU boxes,
    # whose files have no measurement of it: there the hooks run on the host while the device computes).
    zero3_module_call_s: float = 0.0
    # The seconds the step's work (compute, CPU Adam, collectives) loses for each second the drive is busy beside
    # it: the drive's requests cost the cores that work runs on (the I/O threads, the kernel, a virtual disk's
    # emulation). Measured on a host accelerator (`--machine this`: the compute probe's steps timed alone and with
    # the drive reading beside them; 0.45-0.78 on this VM on 2026-11-30, where the two took turns); 0 leaves it out
    # (GPU boxes, whose compute is the GPU's and whose files have no measurement of it).
    io_contention: float = 0.0
    # The data-parallel collectives stage 3 runs every step, as bytes a rank receives from the others per second
    # while every rank of the node runs the same collective: the all-gather of parameter partitions (forward and
    # backward) and the reduce-scatter of gradients (which also adds what it receives). Measured on a host
    # accelerator at 2 ranks (`--machine this`: gloo, whose loops run on the cores that compute, so the model puts
    # them on the compute thread); None leaves them out (one rank needs none; the GPU files have no figure).
    allgather_bytes_per_s: Optional[float] = None
    reduce_scatter_bytes_per_s: Optional[float] = None
    ranks_per_node: int = 1
    nodes: int = 1
    drive_tbw_bytes: Optional[float] = None
    host_available_bytes: Optional[int] = None
    # free bytes where the swap files go (the folder `--machine this` measured; a machine file may say): the node's
    # ranks' swap files must fit there. None: not known, not checked
    nvme_free_bytes: Optional[int] = None
    process_baseline_bytes: int = DEFAULT_PROCESS_BASELINE_BYTES
    accelerator_is_host: bool = False
    sources: Dict[str, str] = dataclasses.field(default_factory=dict)
    # what a measured machine's model figures (compute rates, module calls, I/O contention) were measured on: the host
    # and the model's shape (`--machine this --save-machine`); ``measured_differently`` compares a later estimate's
    measured_for: Dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        # The same checks as a file's, for a Machine built in code (a zero rate would divide by zero in the model),
        # and the same normal form (ints, tuples), so that a machine equals itself read back from its file.
        checked = _checked_values({field.name: getattr(self, field.name) for field in dataclasses.fields(self)},
                                  f"Machine({self.name!r})")
        for key, value in checked.items():
            object.__setattr__(self, key, value)

    # ---------------------------------------------------------------------------------- one rank's share
    @property
    def world_size(self) -> int:
        return self.ranks_per_node * self.nodes

    @property
    def available_host_bytes(self) -> int:
        if self.host_available_bytes is not None:
            return self.host_available_bytes
        return int(self.host_memory_bytes * DEFAULT_AVAILABLE_FRACTION)

    @property
    def nvme_read_bytes_per_s_per_rank(self) -> float:
        """The node's drives (striped or one folder each) shared by its ranks."""
        return self.nvme_read_bytes_per_s_per_drive * self.drives / self.ranks_per_node

    @property
    def nvme_write_bytes_per_s_per_rank(self) -> float:
        return self.nvme_write_bytes_per_s_per_drive * self.drives / self.ranks_per_node

    @property
    def nvme_mixed_bytes_per_s_per_rank(self) -> Optional[float]:
        if self.nvme_mixed_bytes_per_s_per_drive is None:
            return None
        return self.nvme_mixed_bytes_per_s_per_drive * self.drives / self.ranks_per_node

    def nvme_request_factor(self, direction: str, request_bytes: int) -> float:
        """How much faster (above 1) or slower a request of ``request_bytes`` moves than the rate figures say, for
        ``direction`` "read" or "write" (``nvme_request_factors``; 1 without them)."""
        table = self.nvme_request_factors
        if not table or request_bytes <= 0:
            return 1.0
        column = 1 if direction == "read" else 2
        if request_bytes <= table[0][0]:
            return table[0][column]
        for low, high in zip(table, table[1:]):
            if request_bytes <= high[0]:
                share = math.log(request_bytes / low[0]) / math.log(high[0] / low[0])
                return low[column] + share * (high[column] - low[column])
        return table[-1][column]

    @property
    def ranks_per_compute_figure(self) -> int:
        """How many ranks share ``accelerator_flops_per_s``: one accelerator per rank; a host accelerator's figure is
        the node's cores (`--machine this` times them all), which its ranks share."""
        return self.ranks_per_node if self.accelerator_is_host else 1

    @property
    def accelerator_flops_per_s_per_rank(self) -> float:
        return self.accelerator_flops_per_s / self.ranks_per_compute_figure

    @property
    def cpu_adam_elements_per_s_per_rank(self) -> float:
        """The node's cores run every rank's CPU Adam at once."""
        return self.cpu_adam_elements_per_s / self.ranks_per_node

    @property
    def host_copy_bytes_per_s_per_rank(self) -> float:
        return self.host_copy_bytes_per_s / self.ranks_per_node

    @property
    def host_fresh_write_bytes_per_s_per_rank(self) -> Optional[float]:
        if self.host_fresh_write_bytes_per_s is None:
            return None
        return self.host_fresh_write_bytes_per_s / self.ranks_per_node

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


_REQUIRED = ("name", "accelerator_memory_bytes", "accelerator_flops_per_s", "h2d_bytes_per_s", "host_memory_bytes",
             "nvme_read_bytes_per_s_per_drive", "nvme_write_bytes_per_s_per_drive", "drives",
             "cpu_adam_elements_per_s")
_POSITIVE = {"accelerator_flops_per_s", "h2d_bytes_per_s", "host_memory_bytes", "nvme_read_bytes_per_s_per_drive",
             "nvme_write_bytes_per_s_per_drive", "drives", "cpu_adam_elements_per_s", "host_copy_bytes_per_s",
             "host_fresh_write_bytes_per_s", "nvme_mixed_bytes_per_s_per_drive", "ranks_per_node", "nodes",
             "drive_tbw_bytes", "process_baseline_bytes", "allgather_bytes_per_s",
             "reduce_scatter_bytes_per_s"}  # host_available_bytes may be 0: a full cgroup
_INTEGERS = {"accelerator_memory_bytes", "host_memory_bytes", "drives", "ranks_per_node", "nodes",
             "host_available_bytes", "process_baseline_bytes", "nvme_free_bytes"}


def _checked_values(data: Mapping[str, Any], source: str) -> Dict[str, Any]:
    """The figures of ``data`` checked one by one (kind, sign), integers made ints. Raises MachineFileError naming
    ``source`` and the key."""
    values = dict(data)
    for key, value in values.items():
        if key in ("name",):
            if not isinstance(value, str) or not value:
                raise MachineFileError(f"{source}: key \"{key}\" must be a non-empty string, got {value!r}")
        elif key in ("sources", "measured_for"):
            if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
                raise MachineFileError(f"{source}: key \"{key}\" must map names to strings")
            values[key] = dict(value)
        elif key == "accelerator_is_host":
            if not isinstance(value, bool):
                raise MachineFileError(f"{source}: key \"{key}\" must be true or false, got {value!r}")
        elif value is None and key in ("drive_tbw_bytes", "host_available_bytes", "nvme_free_bytes",
                                       "host_fresh_write_bytes_per_s",
                                       "nvme_mixed_bytes_per_s_per_drive", "nvme_request_factors",
                                       "nvme_small_page_factors",
                                       "allgather_bytes_per_s", "reduce_scatter_bytes_per_s"):
            continue
        elif key == "nvme_request_factors":
            values[key] = _checked_request_factors(value, source)
        elif key == "nvme_small_page_factors":
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or len(value) != 3 or any(
                    isinstance(number, bool) or not isinstance(number, (int, float)) or not finite(number)
                    or number <= 0 for number in value):
                raise MachineFileError(f"{source}: key \"nvme_small_page_factors\" must be three positive numbers "
                                       f"[read, write, mixed], got {value!r}")
            values[key] = tuple(float(number) for number in value)
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise MachineFileError(f"{source}: key \"{key}\" must be a number, got {value!r}")
            if not finite(value):
                raise MachineFileError(f"{source}: key \"{key}\" must be a finite number, got {value!r}")
            if key in _POSITIVE and value <= 0 or value < 0:
                raise MachineFileError(f"{source}: key \"{key}\" must be positive, got {value!r}")
            if key in _INTEGERS:
                if value != int(value):  # "drives": 2.5 became 2 drives silently
                    raise MachineFileError(f"{source}: key \"{key}\" must be a whole number, got {value!r}")
                values[key] = int(value)
    return values


def _checked_request_factors(value: Any, source: str) -> Tuple[Tuple[int, float, float], ...]:
    """``nvme_request_factors`` as a tuple of (request bytes, read factor, write factor): at least two rows, sizes
    increasing, every number positive."""
    def refuse(why: str):
        raise MachineFileError(f"{source}: key \"nvme_request_factors\": {why}; it lists at least two [request bytes, "
                               f"read factor, write factor] rows by increasing size, every number positive")

    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        refuse(f"got {value!r}")
    if len(value) < 2:
        refuse(f"{len(value)} row{'s' if len(value) != 1 else ''}")
    rows = []
    for row in value:
        if isinstance(row, (str, bytes)) or not isinstance(row, (list, tuple)) or len(row) != 3 or any(
                isinstance(number, bool) or not isinstance(number, (int, float)) or not finite(number)
                or number <= 0 for number in row):
            refuse(f"row {row!r} is not three positive numbers")
        if row[0] != int(row[0]):
            refuse(f"row {row!r} has a request size that is no whole number of bytes")
        rows.append((int(row[0]), float(row[1]), float(row[2])))
    if any(later[0] <= earlier[0] for earlier, later in zip(rows, rows[1:])):
        refuse(f"sizes not increasing: {[row[0] for row in rows]}")
    return tuple(rows)


def measured_differently(machine: Machine, now: Mapping[str, str]) -> Dict[str, Tuple[str, str]]:
    """{name: (measured on, now)} where a machine measured for one host and model shape (``measured_for``) prices
    another (``now``, the same names): its compute rates are that model's and that host's (helper-212: a saved
    file was reused for any model, silently)."""
    return {name: (value, str(now[name])) for name, value in machine.measured_for.items()
            if name in now and str(now[name]) != value}


def machine_from_dict(data: Mapping[str, Any], source: str = "machine") -> Machine:
    """Check and build. Raises MachineFileError naming ``source`` and the key: a missing required figure, an
    unknown key (a typo would otherwise silently fall back to a default), or a value of the wrong kind."""
    if not isinstance(data, Mapping):
        raise MachineFileError(f"{source}: a machine description is a JSON object, got {type(data).__name__}")
    fields = {field.name for field in dataclasses.fields(Machine)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise MachineFileError(f"{source}: unknown key(s) {', '.join(repr(k) for k in unknown)} (known: "
                               f"{', '.join(sorted(fields))})")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise MachineFileError(f"{source}: missing key(s) {', '.join(repr(k) for k in missing)}")
    return Machine(**_checked_values(data, source))


def load_machine(path: str) -> Machine:
    """Read a machine file. Raises MachineFileError (naming ``path``) when it is missing, not JSON or not valid."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise MachineFileError(f"machine file {path} does not exist (see configs/machines/ for examples, or pass "
                               f"--machine this)") from None
    except (OSError, ValueError) as err:
        raise MachineFileError(f"machine file {path} cannot be read as JSON: {err}") from None
    return machine_from_dict(data, source=f"machine file {path}")
