"""Per-step metrics. Owns: the schema (one typed record per optimizer step, versioned), turning running totals
into per-step numbers, and the JSON-lines file. Pure: the numbers come from integrations/deepspeed/stats.py.

One line per optimizer step at the config's ``metrics_path``, and the latest one in ``tencache_ds.stats(engine)``:

    {"schema": "tencache.metrics/9", "step": 12, "step_time_s": 1.93, "fetch_wait_s": 0.004,
     "param_nvme_wait_s": 0.003, "optimizer_nvme_wait_s": 0.001, "device_fetch_s": 0.41,
     "device_fetch_bytes": 248512512, "device_gathers": 3, "device_hit_rate": 0.87, "host_hit_rate": 1.0,
     "nvme_read_bytes": 0, "nvme_write_bytes": 0, "nvme_write_bytes_per_day": 0.0, "prefetch_issued": 0,
     "prefetch_late": 0, "nvme_busy_fraction": 0.0, "nvme_queue_depth": null, "pinned_bytes_reserved": ...,
     "pinned_bytes_in_use": ..., "host_cache_bytes_in_use": ..., "device_cache_bytes_in_use": ...,
     "device_cache_peak_bytes": ..., "host_cache_budget_bytes": ..., "host_memory_available_bytes": ...,
     "host_step_rise_bytes": ...}

What each per-step number means (this step's, not a running total). A step's record covers everything since the
previous record: an evaluation pass or a checkpoint save between two steps (its time, and the writes of what it
flushed) counts towards the next record; a checkpoint load does not (the meter starts again after it).
- ``step``: the optimizer step's index from 0, as the engine counts its global steps; a step skipped on an
  overflow writes no record, and its number is missing (the next record's time and bytes include its forward and
  backward); after a checkpoint load, from the engine's global step there (integrations/deepspeed/reporting.py
  ``restart_metering``: a resumed run's records go on where the run that saved left off).
- ``param_nvme_wait_s`` / ``optimizer_nvme_wait_s``: time the training thread was blocked on NVMe for parameter
  partitions / optimizer state; ``fetch_wait_s`` is their sum.
- ``device_fetch_s``: time the training thread spent gathering parameters for modules (DeepSpeed's
  fetch_sub_module: all-gathers, host-to-device copies, and the parameter NVMe waits inside them); None where no
  use was counted (the first step, before the device tier knows the step's trace, and a run whose trace never
  completes: nothing was timed then, and 0.0 claimed the gathers took no time).
- ``device_fetch_bytes``: bytes of gathered parameters the step's gathers produced, DeepSpeed's prefetches
  included (the all-gathers' output: at one GPU rank the host-to-device copies, at N ranks N times what each
  copies to its device); ``device_gathers``: how many
  gathers produced them (DeepSpeed gathers a bucket of parameters at a time; each gather has a fixed host cost, so
  many small ones make a slow forward pass; one gather may run several collectives, e.g. quantized and plain
  weights apart, and at one rank on a GPU it is a copy per parameter); ``device_hit_rate``: uses of a parameter
  served without a gather for them over all uses. All three are None where a gather is a view of the partition
  (one rank on DeepSpeed's CPU accelerator: nothing is moved, so a "hit" saves nothing), and the first two when
  the step used no parameter.
- ``nvme_write_bytes_per_day``: this step's NVMe bytes written at its rate, for a day of continuous training: what
  this rank's run costs its drive (a drive's rated TBW divided by it, and by the ranks sharing the drive, is the
  days it lasts: drive_wear.py; ``tencache-ds bench --drive-tbw`` prints them).
- ``nvme_busy_fraction``: the share of the step during which at least one of tencache's file requests was
  executing (any swapper, any NVMe path: io/activity.py); ``nvme_queue_depth``: how many were executing on average
  while any was (None: the drive was idle the whole step). A step bound by I/O should show a busy fraction near 1;
  a fetch wait with the drive idle meanwhile means the reads were issued late, not that the drive is slow.
- ``device_cache_peak_bytes``: the most the device tier held since the previous step's end (an eval pass between
  steps counts towards the next). ``device_cache_bytes_in_use`` is its value at the step's end, which is 0
  wherever the tier keeps parameters only until the update (on a GPU: the optimizer step makes every kept copy
  stale).
- ``nvme_*_bytes``, ``prefetch_*``: this step's (bytes of the file requests it issued, less failed ones: a write
  still running at the step's end is the step's, io/direct_io.py ``IoCounters``); the ``*_bytes_*`` gauges are
  their values at the step's end; a hit rate is None when the step made no such access.
  ``host_memory_available_bytes`` and ``host_step_rise_bytes`` are the last host-memory reading (taken before the
  step's last forward pass, after whatever it decided: integrations/deepspeed/memory_pressure.py).

Schema history: 2 added ``host_cache_budget_bytes``, ``host_memory_available_bytes``, ``host_step_rise_bytes``;
3 added ``param_nvme_wait_s``, ``optimizer_nvme_wait_s``, ``device_fetch_s``, ``device_fetch_bytes``, and made
``device_hit_rate`` None where the device tier cannot apply; 4 added ``nvme_busy_fraction`` and
``nvme_queue_depth``; 5 added ``device_cache_peak_bytes``; 6 added ``device_gathers``; 7 added
``nvme_write_bytes_per_day``; 8 counts ``nvme_*_bytes`` when requests are issued, not when done; 9 makes
``device_fetch_s`` None where no use was counted (helper-218).
"""
import dataclasses
import json
import os
import time
from typing import Callable, Dict, Optional

from .drive_wear import bytes_written_per_day

SCHEMA = "tencache.metrics/9"


@dataclasses.dataclass(frozen=True)
class RunningTotals:
    """What the swappers and the coordinator have counted since they were built (only ever grows)."""

    param_nvme_wait_s: float = 0.0      # time the training thread was blocked on parameter partition reads
    optimizer_nvme_wait_s: float = 0.0  # ... on optimizer-state reads
    device_fetches: int = 0      # uses of a parameter: a module asked for it (non-persistent)
    device_hits: int = 0         # ... already gathered on the device
    device_fetch_bytes: int = 0  # bytes every gather produced (prefetches included)
    device_gathers: int = 0      # gathers that moved bytes (each a bucket of parameters)
    device_fetch_s: float = 0.0  # time in DeepSpeed's fetch_sub_module
    host_hits: int = 0           # tensor uses served from the host tier without I/O
    host_misses: int = 0         # ... that had to be read from NVMe
    nvme_read_bytes: int = 0
    nvme_write_bytes: int = 0
    prefetch_issued: int = 0     # reads started ahead of their use
    prefetch_late: int = 0       # ... not finished when their use came
    nvme_busy_s: float = 0.0     # seconds with at least one of tencache's file requests executing
    nvme_depth_s: float = 0.0    # the integral over time of how many were executing (io/activity.py)

    def minus(self, earlier: "RunningTotals") -> "RunningTotals":
        return RunningTotals(**{field.name: getattr(self, field.name) - getattr(earlier, field.name)
                                for field in dataclasses.fields(self)})


@dataclasses.dataclass(frozen=True)
class Gauges:
    """Memory at a moment."""

    pinned_bytes_reserved: int = 0
    pinned_bytes_in_use: int = 0
    host_cache_bytes_in_use: int = 0
    device_cache_bytes_in_use: int = 0
    device_cache_peak_bytes: int = 0      # the most the device tier held since the previous step's end
    host_cache_budget_bytes: int = 0      # the host tier's budget now (lowered under memory pressure)
    host_memory_available_bytes: int = 0  # node or cgroup memory available at the last reading
    host_step_rise_bytes: int = 0         # how far a step rises above its level between steps (measured)


@dataclasses.dataclass(frozen=True)
class StepMetrics:
    """One optimizer step. ``flat()`` is the JSON line; its key set is the schema (tests/test_metrics.py)."""

    step: int
    step_time_s: float
    fetch_wait_s: float
    param_nvme_wait_s: float
    optimizer_nvme_wait_s: float
    device_fetch_s: Optional[float]
    device_fetch_bytes: Optional[int]
    device_gathers: Optional[int]
    device_hit_rate: Optional[float]
    host_hit_rate: Optional[float]
    nvme_read_bytes: int
    nvme_write_bytes: int
    nvme_write_bytes_per_day: Optional[float]
    prefetch_issued: int
    prefetch_late: int
    nvme_busy_fraction: float
    nvme_queue_depth: Optional[float]
    pinned_bytes_reserved: int
    pinned_bytes_in_use: int
    host_cache_bytes_in_use: int
    device_cache_bytes_in_use: int
    device_cache_peak_bytes: int
    host_cache_budget_bytes: int
    host_memory_available_bytes: int
    host_step_rise_bytes: int
    schema: str = SCHEMA

    def flat(self) -> Dict[str, object]:
        return dataclasses.asdict(self)


def _rate(hits: int, total: int) -> Optional[float]:
    return hits / total if total > 0 else None


class StepMeter:
    """``step_end(totals, gauges)`` at the end of each optimizer step returns that step's StepMetrics: the totals'
    increase since the previous call (since the meter was built, for the first) and the time since then."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, start: RunningTotals = RunningTotals()):
        self._clock = clock
        self._last_time = clock()
        self._last_totals = start
        self._steps = 0
        self.latest: Optional[StepMetrics] = None
        self.path: Optional[str] = None  # the file its records are appended to (None: none)

    def restart(self, totals: RunningTotals, next_step: int) -> None:
        """Measure the next step from now and ``totals`` (what happened since the last step is not one: a
        checkpoint load), numbered ``next_step`` (the loaded run's next step, as the run that saved numbered it)."""
        self._last_time, self._last_totals, self._steps = self._clock(), totals, int(next_step)

    def optimizer_step(self, step: Callable[[], object]) -> object:
        """Run one optimizer ``step()``: one that ended without ``step_end`` (skipped on an overflow: stage 3 returns
        before its _post_step) takes its number all the same, as the engine counts it in its global steps, so that
        the records stay numbered by optimizer step, and a resumed run's (``restart``) go on from the right one. Its
        time and I/O are the next record's."""
        numbered = self._steps
        result = step()
        if self._steps == numbered:
            self._steps += 1
        return result

    def step_end(self, totals: RunningTotals, gauges: Gauges, device_tier_applies: bool = True) -> StepMetrics:
        """``device_tier_applies``: False where a gather is a view of the partition (the device numbers are None)."""
        now = self._clock()
        delta = totals.minus(self._last_totals)
        device_used = device_tier_applies and delta.device_fetches > 0
        self.latest = StepMetrics(
            step=self._steps, step_time_s=now - self._last_time,
            fetch_wait_s=delta.param_nvme_wait_s + delta.optimizer_nvme_wait_s,
            param_nvme_wait_s=delta.param_nvme_wait_s, optimizer_nvme_wait_s=delta.optimizer_nvme_wait_s,
            device_fetch_s=delta.device_fetch_s if delta.device_fetches > 0 else None,
            device_fetch_bytes=delta.device_fetch_bytes if device_used else None,
            device_gathers=delta.device_gathers if device_used else None,
            device_hit_rate=_rate(delta.device_hits, delta.device_fetches) if device_tier_applies else None,
            host_hit_rate=_rate(delta.host_hits, delta.host_hits + delta.host_misses),
            nvme_read_bytes=delta.nvme_read_bytes, nvme_write_bytes=delta.nvme_write_bytes,
            nvme_write_bytes_per_day=bytes_written_per_day(delta.nvme_write_bytes, now - self._last_time),
            prefetch_issued=delta.prefetch_issued, prefetch_late=delta.prefetch_late,
            nvme_busy_fraction=min(1.0, delta.nvme_busy_s / (now - self._last_time)) if now > self._last_time
            else 0.0,
            nvme_queue_depth=delta.nvme_depth_s / delta.nvme_busy_s if delta.nvme_busy_s > 0 else None,
            **dataclasses.asdict(gauges))
        self._steps += 1
        self._last_time, self._last_totals = now, totals
        return self.latest


class MetricsWriter:
    """Appends one StepMetrics per line to ``path`` (line-buffered: a killed run keeps every finished step)."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._handle = open(path, "a", buffering=1)

    def write(self, metrics: StepMetrics) -> None:
        self._handle.write(json.dumps(metrics.flat(), sort_keys=True) + "\n")

    def close(self) -> None:
        self._handle.close()
