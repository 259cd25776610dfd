"""Comparison of stock DeepSpeed and tencache_ds runs. Owns: per-step series from result dicts, their aggregation
over measured steps and repeats, the I/O-compute bound, and the comparison's text, markdown and JSON forms (a
headline of at most 12 rows, then the full table). Does not own: launching runs, reading the machine, measuring
the NVMe path (tencache_ds/cli/bench.py) or the figure (bench/dashboard.py). Pure; imports neither torch nor
deepspeed.

The inputs follow the result contract of scripts/train.py:

    result = {label, model, num_params, ds_config, init_time_s?, nvme_usage?, weights_sha256, ...,
              steps: [{step, loss, loss_bits, time_s, peak_rss_bytes, io_read_bytes, io_write_bytes, stats}]}

- ``io_*_bytes`` are this step's /proc/self/io deltas; ``peak_rss_bytes`` is the process peak so far.
- ``stats`` is ``tencache_ds.stats(engine)`` after the step (a flat dict) or None. Its counters (``nvme_read_bytes``
  and the like) are totals since the engine started (a Counter's ``total``, style.md 8.6), so a step's value is the
  difference from the previous step; the first step's difference includes what engine start-up did.
- metrics rows (the JSON lines the tencache block writes to ``metrics_path``) are one flat dict per optimizer step.
  Rows with ``"schema": "tencache.metrics/N"`` (N >= 1) carry ``nvme_read_bytes``/``nvme_write_bytes`` per step (older rows
  carry running totals there and the per-step value as ``nvme_*_bytes_per_step``), and the per-step
  ``fetch_wait_s``, ``device_hit_rate`` and ``host_hit_rate``.

Warm-up steps are the first ``warmup_steps`` entries of each run; they are excluded from medians but drawn in the
figure. A value that does not exist for an arm (stock has no hit rates) is None and shows as "–".
"""
import dataclasses
import json
import math
import os
import re
import statistics
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ..units import fmt_bytes

STOCK = "stock"
TENCACHE = "tencache"
ARMS = (STOCK, TENCACHE)
# Optional third arm (`bench --compare cpu`): stock DeepSpeed with offload device "cpu", same config otherwise --
# what a user whose host memory holds the model would pick. Its bits must equal stock NVMe's.
STOCK_CPU = "stock-cpu"
MISSING = "–"  # the cell of a value an arm does not have

# The per-step quantities of the headline and the figure (step_series), one name each.
STEP_TIME = "step_time_s"
NVME_READ = "nvme_read_bytes"        # bytes read from NVMe in the step
NVME_WRITE = "nvme_write_bytes"      # bytes written to NVMe in the step
PINNED = "pinned_bytes_reserved"     # pinned host memory (for stock: what DeepSpeed locks, from tencache_ds.stats)
PEAK_RSS = "peak_rss_bytes"          # the process's peak RSS so far
DEVICE_HIT = "device_hit_rate"
HOST_HIT = "host_hit_rate"
FETCH_WAIT = "fetch_wait_s"          # time the step waited for tensors to arrive
STEP_SERIES = (STEP_TIME, NVME_READ, NVME_WRITE, PINNED, PEAK_RSS, DEVICE_HIT, HOST_HIT, FETCH_WAIT)

METRICS_SCHEMA_KEY = "schema"
METRICS_SCHEMA_PREFIX = "tencache.metrics/"  # "tencache.metrics/1" and later: nvme_*_bytes are per step
PINNED_PEAK_KEY = "pinned_bytes_peak_in_use"
# Stats/metrics keys the headline (or a fixed row) already shows; the generic rows of the full table skip them.
FIXED_KEYS = frozenset(STEP_SERIES) | {PINNED_PEAK_KEY, "nvme_read_bytes_per_step", "nvme_write_bytes_per_step"}
METRICS_STEP_KEY = "step"  # the step number in a metrics row; not a metric
# Wall-clock stamps in metrics rows ("time_unix_s"): not comparable between runs.
TIMESTAMP_KEY = re.compile(r"unix|timestamp|wall_clock", re.IGNORECASE)

# Headline row names (render order). At most 12 rows: what a user reads at a glance.
ROW_STEP_TIME = "step time (s, median)"
ROW_BOUND = "bound (s)"
ROW_VS_BOUND = "step time / bound"
ROW_PINNED = "pinned host memory (max)"
ROW_PEAK_RSS = "peak host RSS"
ROW_NVME_READ = "NVMe read / step (median)"
ROW_NVME_WRITE = "NVMe written / step (median)"
ROW_DEVICE_HIT = "device hit rate (median)"
ROW_HOST_HIT = "host hit rate (median)"
ROW_FETCH_WAIT = "fetch wait (s/step, median)"
ROW_FETCH_SHARE = "fetch wait (% of step time)"
ROW_IDENTICAL = "identical losses / weights"
HEADLINE_ROWS = (ROW_STEP_TIME, ROW_BOUND, ROW_VS_BOUND, ROW_PINNED, ROW_PEAK_RSS, ROW_NVME_READ, ROW_NVME_WRITE,
                 ROW_DEVICE_HIT, ROW_HOST_HIT, ROW_FETCH_WAIT, ROW_FETCH_SHARE, ROW_IDENTICAL)
MAX_HEADLINE_ROWS = 12

Value = Union[float, int, str, None]


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """One training run. ``repeat`` is 1-based; ``metrics_rows`` are the run's metrics JSON lines (may be empty)."""

    arm: str
    repeat: int
    result: Dict[str, Any]
    metrics_rows: Tuple[Dict[str, Any], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.arm}-{self.repeat}"

    @property
    def steps(self) -> List[Dict[str, Any]]:
        return list(self.result.get("steps") or [])


@dataclasses.dataclass(frozen=True)
class ComparisonRow:
    """One line of the comparison. ``unit`` is "s", "bytes", "count", "fraction" (shown as %), "percent", "times"
    or "text". ``verdict`` replaces the ratio cell for rows that compare equality (losses, weights). ``stock_cpu``
    is the third arm's value (None when that arm did not run or has no such value)."""

    name: str
    unit: str
    stock: Value
    tencache: Value
    ratio: Optional[float] = None
    verdict: Optional[str] = None
    note: str = ""
    stock_cpu: Value = None

    def cells(self, with_stock_cpu: bool = False) -> Tuple[str, ...]:
        """(name, stock, tencache, tencache/stock[, stock-cpu]) as displayed."""
        ratio_cell = self.verdict if self.verdict is not None else format_ratio(self.ratio)
        cells = (self.name, format_value(self.stock, self.unit), format_value(self.tencache, self.unit), ratio_cell)
        return cells + ((format_value(self.stock_cpu, self.unit),) if with_stock_cpu else ())

    def to_dict(self, with_stock_cpu: bool) -> Dict[str, Any]:
        cells = self.cells(with_stock_cpu)
        row = {"name": self.name, "unit": self.unit, "stock": self.stock, "tencache": self.tencache,
               "ratio": self.ratio, "verdict": self.verdict, "note": self.note,
               "cells": dict(zip((STOCK, TENCACHE, "ratio", STOCK_CPU), cells[1:]))}
        if with_stock_cpu:
            row[STOCK_CPU] = self.stock_cpu
        return row


@dataclasses.dataclass(frozen=True)
class NvmeBandwidth:
    """Sequential bandwidth of the NVMe path in bytes per second: measured by the bench as `tencache-ds doctor`
    measures it, or given with --nvme-bandwidth (then read = write). ``source`` says which, for the report."""

    read_bytes_per_s: float
    write_bytes_per_s: float
    source: str

    def speeds(self) -> str:
        if self.read_bytes_per_s == self.write_bytes_per_s:
            return f"{self.read_bytes_per_s / 1e9:.2f} GB/s"
        return f"read {self.read_bytes_per_s / 1e9:.2f} GB/s, write {self.write_bytes_per_s / 1e9:.2f} GB/s"

    def describe(self) -> str:
        return f"{self.speeds()} ({self.source})"


@dataclasses.dataclass(frozen=True)
class Bound:
    """The I/O-compute bound on tencache's step time: the larger of ``compute_s``, the least time the step's work
    takes without waiting for NVMe (the smaller of stock CPU offload's step, the same work with no NVMe at all, and
    tencache's own step less the time it was blocked on NVMe; ``compute_source`` says which), and ``io_s``, the time the NVMe
    path needs for the bytes tencache moves per step (median read / read bandwidth + median written / write
    bandwidth: reads and writes share the drive; None without a bandwidth). A step cannot beat either part, so
    ``step time / bound`` near 1 means nothing is left to win on this machine."""

    compute_s: Optional[float]
    io_s: Optional[float]
    bandwidth: Optional[NvmeBandwidth]
    read_bytes: Optional[float] = None
    write_bytes: Optional[float] = None
    compute_source: str = "the stock-cpu step"

    @property
    def seconds(self) -> Optional[float]:
        # No NVMe bytes and no compute arm bound nothing: "0 s" would read as a bound the step cannot reach.
        parts = [part for part in (self.compute_s, self.io_s) if part is not None and part > 0]
        return max(parts) if parts else None

    @property
    def limited_by(self) -> Optional[str]:
        if self.seconds is None:
            return None
        return "NVMe" if self.io_s is not None and self.io_s >= (self.compute_s or 0.0) else "compute"

    def describe(self) -> str:
        """One line: the bound and its two parts, or why it is missing (bench.md names the bandwidth's source)."""
        parts = [f"compute {self.compute_s:.3f} s ({self.compute_source})" if self.compute_s is not None
                 else "compute: unknown (run with --compare cpu)"]
        if self.io_s is not None:
            parts.append(f"NVMe {self.io_s:.3f} s ({fmt_bytes(self.read_bytes or 0)} read + "
                         f"{fmt_bytes(self.write_bytes or 0)} written per step at {self.bandwidth.speeds()})")
        elif self.bandwidth is None:
            parts.append("NVMe: no bandwidth (not measured; pass --nvme-bandwidth)")
        else:
            parts.append("NVMe: tencache's bytes per step are unknown")
        if self.seconds is None:
            return "no bound: " + "; ".join(parts)
        return f"{self.seconds:.3f} s, limited by {self.limited_by}; " + "; ".join(parts)

    def to_dict(self) -> Dict[str, Any]:
        return {"seconds": self.seconds, "limited_by": self.limited_by, "compute_s": self.compute_s,
                "io_s": self.io_s, "read_bytes_per_step": self.read_bytes, "write_bytes_per_step": self.write_bytes,
                "bandwidth": dataclasses.asdict(self.bandwidth) if self.bandwidth else None,
                "text": self.describe()}


def compute_bound(read_bytes: Optional[float], write_bytes: Optional[float], bandwidth: Optional[NvmeBandwidth],
                  compute_s: Optional[float], compute_source: str = "the stock-cpu step") -> Bound:
    """The Bound for tencache moving ``read_bytes``/``write_bytes`` per step; e.g. 2 GB read + 1 GB written at
    2 GB/s each -> io_s 1.5 s, and with a 1.2 s stock CPU offload step the bound is 1.5 s (NVMe-limited)."""
    io_s = None
    if bandwidth is not None and is_number(read_bytes) and is_number(write_bytes):
        io_s = read_bytes / bandwidth.read_bytes_per_s + write_bytes / bandwidth.write_bytes_per_s
    return Bound(compute_s, io_s, bandwidth, read_bytes, write_bytes, compute_source)


def least_compute(stock_cpu_step: Value, tencache_step: Value, tencache_io_wait: Value
                  ) -> Tuple[Optional[float], str]:
    """The least time the step's work takes with no NVMe wait, and where it comes from: the smaller of stock CPU
    offload's step and tencache's step less its I/O wait (either can be the smaller: stock CPU offload has costs
    tencache avoids, such as gathering each parameter once per micro-batch), so that no step is measured below it."""
    candidates = []
    if is_number(stock_cpu_step):
        candidates.append((float(stock_cpu_step), "the stock-cpu step"))
    if is_number(tencache_step) and is_number(tencache_io_wait):
        candidates.append((float(tencache_step) - float(tencache_io_wait), "tencache's step less its NVMe wait"))
    return min(candidates) if candidates else (None, "")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Everything the table, markdown and JSON outputs show: ``headline`` (HEADLINE_ROWS, in that order) and
    ``details`` (every other row). ``losses_identical``/``weights_identical`` cover every run of every arm (so
    repeats of one arm are checked against each other too)."""

    headline: List[ComparisonRow]
    details: List[ComparisonRow]
    bound: Bound
    warmup_steps: int
    num_measured_steps: Dict[str, int]
    losses_identical: bool
    losses_detail: str
    weights_identical: bool
    weights_detail: str
    runs: List[Dict[str, Any]]
    notes: List[str]

    @property
    def has_stock_cpu(self) -> bool:
        return STOCK_CPU in self.num_measured_steps

    @property
    def rows(self) -> List[ComparisonRow]:
        return self.headline + self.details

    def row(self, name: str) -> ComparisonRow:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no row named {name!r}; rows: {[r.name for r in self.rows]}")

    def to_dict(self) -> Dict[str, Any]:
        return {"warmup_steps": self.warmup_steps, "num_measured_steps": self.num_measured_steps,
                "losses_identical": self.losses_identical, "losses_detail": self.losses_detail,
                "weights_identical": self.weights_identical, "weights_detail": self.weights_detail,
                "bound": self.bound.to_dict(), "runs": self.runs, "notes": self.notes,
                "headline": [row.to_dict(self.has_stock_cpu) for row in self.headline],
                "details": [row.to_dict(self.has_stock_cpu) for row in self.details]}


# ----------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------
def load_result(path: str) -> Dict[str, Any]:
    """A result file written by scripts/train.py. Raises ValueError naming the file when it is not one."""
    with open(path) as fh:
        try:
            result = json.load(fh)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not a JSON result file ({err})") from None
    if not isinstance(result, dict) or not isinstance(result.get("steps"), list):
        raise ValueError(f"{path}: a result file needs a 'steps' list (scripts/train.py --result-file)")
    return result


def load_metrics_rows(path: str) -> Tuple[Dict[str, Any], ...]:
    """The metrics JSON lines at ``path`` (one dict per step); () when the file does not exist."""
    if not path or not os.path.exists(path):
        return ()
    rows = []
    with open(path) as fh:
        for line_number, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_number}: not a JSON line ({err})") from None
            if isinstance(row, dict):
                rows.append(row)
    return tuple(rows)


# ----------------------------------------------------------------------------------------------------------------
# Per-step series
# ----------------------------------------------------------------------------------------------------------------
def is_number(value: Any) -> bool:
    """True for finite ints and floats (bools are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def per_step_deltas(totals: Sequence[Optional[float]]) -> List[Optional[float]]:
    """Per-step values of a counter recorded as running totals, e.g. [10, 30, 60] -> [10, 20, 30]. A step with no
    total, or right after one, gives None."""
    deltas: List[Optional[float]] = []
    previous: Optional[float] = 0.0
    for total in totals:
        if total is None or previous is None:
            deltas.append(None)
        else:
            deltas.append(total - previous)
        previous = total
    return deltas


def _aligned_metrics(run: BenchRun) -> List[Optional[Dict[str, Any]]]:
    """The metrics row for each result step: matched on the row's "step" key when rows have one, else by position."""
    rows = run.metrics_rows
    steps = run.steps
    if rows and all(is_number(row.get(METRICS_STEP_KEY)) for row in rows):
        by_step = {int(row[METRICS_STEP_KEY]): row for row in rows}
        return [by_step.get(int(step.get("step", index))) for index, step in enumerate(steps)]
    return [rows[index] if index < len(rows) else None for index in range(len(steps))]


def _stats_rows(run: BenchRun) -> List[Optional[Dict[str, Any]]]:
    return [step.get("stats") if isinstance(step.get("stats"), dict) else None for step in run.steps]


def _field(name: str, source: Iterable[Optional[Dict[str, Any]]]) -> List[Optional[float]]:
    return [float(row[name]) if row and is_number(row.get(name)) else None for row in source]


def _has_values(values: Sequence[Optional[float]]) -> bool:
    return any(value is not None for value in values)


def _is_schema_row(row: Optional[Dict[str, Any]]) -> bool:
    return bool(row) and str(row.get(METRICS_SCHEMA_KEY, "")).startswith(METRICS_SCHEMA_PREFIX)


def nvme_per_step(run: BenchRun, direction: str) -> Tuple[List[Optional[float]], str]:
    """The NVMe bytes a run read ("read") or wrote ("write") in each step, and where they come from: what the kernel
    saw the process do (/proc/self/io), the one source every arm has (stock DeepSpeed counts nothing itself), so the
    arms are compared alike; else tencache's own counters (own_nvme_per_step)."""
    from_kernel = _field(f"io_{direction}_bytes", run.steps)
    if _has_values(from_kernel):
        return from_kernel, "/proc/self/io"
    return own_nvme_per_step(run, direction)


def own_nvme_per_step(run: BenchRun, direction: str) -> Tuple[List[Optional[float]], str]:
    """The NVMe bytes tencache counted itself in each step, and where they come from: the metrics rows (per step),
    else the differences of the stats' running totals; else None per step ("none")."""
    key = f"nvme_{direction}_bytes"
    metrics = _aligned_metrics(run)
    per_step = _field(key, [row if _is_schema_row(row) else None for row in metrics])
    if not _has_values(per_step):  # rows older than the schema: totals under key, the step's part as <key>_per_step
        per_step = _field(f"{key}_per_step", metrics)
    if _has_values(per_step):
        return per_step, "metrics"
    totals = _field(key, _stats_rows(run))
    if _has_values(totals):
        return per_step_deltas(totals), "stats"
    return [None] * len(run.steps), "none"


def step_series(run: BenchRun) -> Dict[str, List[Optional[float]]]:
    """The headline quantities (STEP_SERIES) per step, each as long as the run's step list, None where the run has
    no such value. Step time and peak RSS come from the result (train.py measures every arm alike); NVMe bytes from
    nvme_per_step; the rest from the metrics rows, else from the stats of the same name."""
    metrics, stats = _aligned_metrics(run), _stats_rows(run)
    series = {STEP_TIME: _field("time_s", run.steps), PEAK_RSS: _field(PEAK_RSS, run.steps),
              NVME_READ: nvme_per_step(run, "read")[0], NVME_WRITE: nvme_per_step(run, "write")[0]}
    for key in (PINNED, DEVICE_HIT, HOST_HIT, FETCH_WAIT):
        from_metrics = _field(key, metrics)
        series[key] = from_metrics if _has_values(from_metrics) else _field(key, stats)
    return {key: series[key] for key in STEP_SERIES}


def run_series(run: BenchRun) -> Dict[str, List[Optional[float]]]:
    """Every per-step numeric series of a run for the full table, each as long as the run's step list (None where
    missing): "io_read_bytes", "io_write_bytes", "stats.<key>" for every numeric stats key (the value after the
    step) and "metrics.<key>" for every numeric metrics key."""
    series: Dict[str, List[Optional[float]]] = {
        "io_read_bytes": _field("io_read_bytes", run.steps),
        "io_write_bytes": _field("io_write_bytes", run.steps),
    }
    stats_rows = _stats_rows(run)
    for key in sorted({key for row in stats_rows if row for key, value in row.items() if is_number(value)}):
        series[f"stats.{key}"] = _field(key, stats_rows)
    metrics_rows = _aligned_metrics(run)
    metrics_keys = sorted({key for row in metrics_rows if row for key, value in row.items()
                           if is_number(value) and key != METRICS_STEP_KEY and not TIMESTAMP_KEY.search(key)})
    for key in metrics_keys:
        series[f"metrics.{key}"] = _field(key, metrics_rows)
    return series


def _measured(values: Sequence[Optional[float]], warmup_steps: int) -> List[float]:
    return [value for value in values[warmup_steps:] if value is not None]


def _median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def _max(values: Iterable[Optional[float]]) -> Optional[float]:
    present = [value for value in values if value is not None]
    return max(present) if present else None


# ----------------------------------------------------------------------------------------------------------------
# Equality checks
# ----------------------------------------------------------------------------------------------------------------
def compare_losses(runs: Sequence[BenchRun]) -> Tuple[bool, str]:
    """Whether every run has the same loss bit pattern at every step. Returns (identical, detail); the detail
    names the first differing run and step."""
    if not runs:
        return False, "no runs"
    reference = runs[0]
    reference_bits = [step.get("loss_bits") for step in reference.steps]
    if not reference_bits or any(bits is None for bits in reference_bits):
        return False, f"{reference.label} has no loss_bits to compare"
    for run in runs[1:]:
        bits = [step.get("loss_bits") for step in run.steps]
        if len(bits) != len(reference_bits):
            return False, f"{run.label} has {len(bits)} steps, {reference.label} has {len(reference_bits)}"
        for index, (expected, actual) in enumerate(zip(reference_bits, bits)):
            if actual != expected:
                return False, (f"{run.label} step {index}: loss bits {actual} "
                               f"vs {reference.label} {expected}")
    return True, f"all {len(reference_bits)} steps bit-identical across {len(runs)} runs"


def compare_weights(runs: Sequence[BenchRun]) -> Tuple[bool, str]:
    """Whether every run ends with the same fp32 weights (``weights_sha256``). Returns (identical, detail)."""
    if not runs:
        return False, "no runs"
    digests = [(run.label, run.result.get("weights_sha256")) for run in runs]
    missing = [label for label, digest in digests if not digest]
    if missing:
        return False, f"no weights_sha256 in {', '.join(missing)}"
    reference_label, reference_digest = digests[0]
    for label, digest in digests[1:]:
        if digest != reference_digest:
            return False, f"{label} sha256 {digest[:12]}… vs {reference_label} {reference_digest[:12]}…"
    return True, f"sha256 {reference_digest[:12]}… in all {len(runs)} runs"


# ----------------------------------------------------------------------------------------------------------------
# Aggregation
# ----------------------------------------------------------------------------------------------------------------
def ratio(stock: Value, tencache: Value) -> Optional[float]:
    """tencache / stock, or None when either is missing or not a number or stock is 0."""
    if not (is_number(stock) and is_number(tencache)) or stock == 0:
        return None
    return float(tencache) / float(stock)


def unit_of_key(key: str) -> str:
    """Display unit guessed from a metric name: "..._bytes..." -> bytes, "..._s" -> seconds, "..._rate" -> a
    fraction (shown as %), else a count."""
    lowered = key.lower()
    if "bytes" in lowered:
        return "bytes"
    if lowered.endswith("_s") or lowered.endswith("_seconds"):
        return "s"
    if lowered.endswith("_rate"):
        return "fraction"
    return "count"


def _final_value(run: BenchRun, key: str) -> Value:
    """The last value of stats[key] in a run (numbers and strings)."""
    for step in reversed(run.steps):
        stats = step.get("stats")
        if isinstance(stats, dict) and key in stats and (is_number(stats[key]) or isinstance(stats[key], str)):
            return stats[key]
    return None


def _arm_final(runs: Sequence[BenchRun], key: str) -> Value:
    """The median over runs of the final numeric value; for strings, the distinct values joined."""
    values = [value for value in (_final_value(run, key) for run in runs) if value is not None]
    numbers = [value for value in values if is_number(value)]
    if numbers:
        return _median(numbers)
    texts = sorted({str(value) for value in values})
    return ", ".join(texts) if texts else None


def _arm_top_level(runs: Sequence[BenchRun], key: str) -> Optional[float]:
    return _median([float(run.result[key]) for run in runs if is_number(run.result.get(key))])


def _nvme_footprint(run: BenchRun) -> Optional[float]:
    usage = run.result.get("nvme_usage")
    if not isinstance(usage, dict) or not usage:
        return None
    return float(sum(entry.get("bytes", 0) for entry in usage.values() if isinstance(entry, dict)))


def _share_percent(part: Value, whole: Value) -> Optional[float]:
    return 100.0 * float(part) / float(whole) if is_number(part) and is_number(whole) and whole else None


STAGE3_FETCH_KNOBS = ("stage3_max_reuse_distance", "stage3_max_live_parameters", "stage3_prefetch_bucket_size",
                      "stage3_param_persistence_threshold")


def _stage3_knobs(run: BenchRun) -> str:
    """The stage-3 knobs that decide when parameters are fetched and released, as the run's config set them (a
    comparison is only fair when the reader sees them: stock NVMe needs some set to run at all)."""
    zero = (run.result.get("ds_config") or {}).get("zero_optimization") or {}
    chosen = [f"{key[len('stage3_'):]}={zero[key]:g}" if is_number(zero[key]) else f"{key}={zero[key]}"
              for key in STAGE3_FETCH_KNOBS if key in zero]
    return ", ".join(chosen) + " (the rest DeepSpeed's defaults)" if chosen else "DeepSpeed's defaults"


def _final_loss_bits(runs: Sequence[BenchRun]) -> Optional[str]:
    steps = runs[0].steps if runs else []
    return steps[-1].get("loss_bits") if steps else None


def _yes_no(identical: bool) -> str:
    return "yes" if identical else "NO"


def compare(runs: Sequence[BenchRun], warmup_steps: int, nvme_bandwidth: Optional[NvmeBandwidth] = None,
            stock_crashed: Optional[str] = None) -> Comparison:
    """Aggregate the runs of each arm (stock, tencache, and stock-cpu when it ran) into the comparison.

    Per arm: step time, per-step bytes, hit rates and fetch waits are the median of all measured steps of all its
    repeats; peaks (pinned memory, RSS) are the maximum over all steps; stats keys without a row of their own show
    the median over repeats of the value after the last step; metrics keys show the median over measured steps.
    The bound uses ``nvme_bandwidth`` (None: its NVMe part is missing) and the stock-cpu step time.
    ``stock_crashed``: stock NVMe did not finish (what it died of); its column then reads "–", and tencache is
    compared with stock CPU offload, which must have run.

    Raises:
        ValueError: no run of stock (unless it crashed, with stock-cpu there) or tencache, or warm-up leaves a run
        no measured step.
    """
    by_arm = {arm: [run for run in runs if run.arm == arm] for arm in ARMS + (STOCK_CPU,)}
    for arm in ARMS:
        if not by_arm[arm] and not (arm == STOCK and stock_crashed and by_arm[STOCK_CPU]):
            raise ValueError(f"no {arm} run to compare (runs: {[run.label for run in runs]})")
    arms = tuple(arm for arm in ARMS if by_arm[arm]) + ((STOCK_CPU,) if by_arm[STOCK_CPU] else ())
    for arm in arms:
        for run in by_arm[arm]:
            if len(run.steps) <= warmup_steps:
                raise ValueError(f"{run.label} has {len(run.steps)} steps, all within the {warmup_steps} warm-up "
                                 "steps; run more steps or lower --warmup")
    series = {run.label: dict(step_series(run), **run_series(run)) for run in runs}

    def median_of(name: str) -> Callable[[Sequence[BenchRun]], Optional[float]]:
        return lambda arm_runs: _median([value for run in arm_runs
                                         for value in _measured(series[run.label].get(name, []), warmup_steps)])

    def max_of(name: str) -> Callable[[Sequence[BenchRun]], Optional[float]]:
        return lambda arm_runs: _max(value for run in arm_runs for value in series[run.label].get(name, []))

    def per_arm(fn: Callable[[Sequence[BenchRun]], Value]) -> Dict[str, Value]:
        return {arm: fn(by_arm[arm]) for arm in arms}

    def make_row(name: str, unit: str, values: Dict[str, Value], note: str = "") -> ComparisonRow:
        return ComparisonRow(name, unit, values.get(STOCK), values[TENCACHE],
                             ratio(values.get(STOCK), values[TENCACHE]), None, note, values.get(STOCK_CPU))

    # ---- the headline
    step_time = per_arm(median_of(STEP_TIME))
    nvme = {direction: per_arm(median_of(key)) for direction, key in (("read", NVME_READ), ("write", NVME_WRITE))}
    nvme_sources = "; ".join(f"{arm}: {nvme_per_step(by_arm[arm][0], 'read')[1]}" for arm in arms)
    fetch_wait = per_arm(median_of(FETCH_WAIT))
    compute_s, compute_source = least_compute(step_time.get(STOCK_CPU), step_time[TENCACHE], fetch_wait[TENCACHE])
    bound = compute_bound(nvme["read"][TENCACHE], nvme["write"][TENCACHE], nvme_bandwidth, compute_s, compute_source)
    vs_bound = (step_time[TENCACHE] / bound.seconds if bound.seconds and is_number(step_time[TENCACHE]) else None)
    vs_bound_note = ""
    if vs_bound is not None and vs_bound < 1:
        # a step measured below its bound means the bound is wrong: here the NVMe term, whose bandwidth (doctor's
        # one-request-at-a-time measurement, or --nvme-bandwidth) understates what tencache's engine moved
        vs_bound, vs_bound_note = None, (f"no ratio: the step ({step_time[TENCACHE]:.3f} s) is below the bound, so "
                                         "the NVMe bandwidth it uses understates the drive; pass the drive's "
                                         "measured bandwidth with --nvme-bandwidth")
    losses_identical, losses_detail = compare_losses([run for arm in arms for run in by_arm[arm]])
    weights_identical, weights_detail = compare_weights([run for arm in arms for run in by_arm[arm]])
    headline = [
        make_row(ROW_STEP_TIME, "s", step_time),
        ComparisonRow(ROW_BOUND, "s", None, bound.seconds, note=bound.describe()),
        ComparisonRow(ROW_VS_BOUND, "times", None, vs_bound, note=vs_bound_note),
        make_row(ROW_PINNED, "bytes", per_arm(max_of(PINNED))),
        make_row(ROW_PEAK_RSS, "bytes", per_arm(max_of(PEAK_RSS))),
        make_row(ROW_NVME_READ, "bytes", nvme["read"], note=f"from {nvme_sources}"),
        make_row(ROW_NVME_WRITE, "bytes", nvme["write"]),
        make_row(ROW_DEVICE_HIT, "fraction", per_arm(median_of(DEVICE_HIT))),
        make_row(ROW_HOST_HIT, "fraction", per_arm(median_of(HOST_HIT))),
        make_row(ROW_FETCH_WAIT, "s", fetch_wait),
        make_row(ROW_FETCH_SHARE, "percent", {arm: _share_percent(fetch_wait[arm], step_time[arm]) for arm in arms},
                 note="the median fetch wait over the median step time"),
        ComparisonRow(ROW_IDENTICAL, "text", _final_loss_bits(by_arm[STOCK]), _final_loss_bits(by_arm[TENCACHE]),
                      verdict=f"{_yes_no(losses_identical)} / {_yes_no(weights_identical)}",
                      stock_cpu=_final_loss_bits(by_arm[STOCK_CPU])),
    ]
    assert [row.name for row in headline] == list(HEADLINE_ROWS) and len(headline) <= MAX_HEADLINE_ROWS

    # ---- the full table: everything else
    details = [make_row("pinned bytes peak in use (stats, max)", "bytes", per_arm(max_of(f"stats.{PINNED_PEAK_KEY}")))]
    if any(own_nvme_per_step(run, "read")[1] != "none" for run in runs):  # tencache's own view beside the kernel's
        for direction in ("read", "write"):
            own = {run.label: own_nvme_per_step(run, direction)[0] for run in runs}
            details.append(make_row(f"NVMe {direction} bytes/step (tencache's own counters, median)", "bytes",
                                    per_arm(lambda rs: _median([value for run in rs
                                                                for value in _measured(own[run.label],
                                                                                       warmup_steps)]))))
    if any(is_number(run.result.get("init_time_s")) for run in runs):
        details.append(make_row("engine start-up (s)", "s", per_arm(lambda rs: _arm_top_level(rs, "init_time_s"))))
    if any(_nvme_footprint(run) is not None for run in runs):
        details.append(make_row("swap files on NVMe after the run", "bytes", per_arm(
            lambda rs: _median([value for value in map(_nvme_footprint, rs) if value is not None]))))
    # Every other stats key, whatever features add later: the value after the last step.
    stats_keys = sorted({key for run in runs for stats in _stats_rows(run) if stats for key, value in stats.items()
                         if (is_number(value) or isinstance(value, str)) and key not in FIXED_KEYS})
    for key in stats_keys:
        values = per_arm(lambda rs: _arm_final(rs, key))
        unit = "text" if any(isinstance(value, str) for value in values.values()) else unit_of_key(key)
        details.append(make_row(f"stats.{key} (after last step)", unit, values))
    # Every metrics key the stats do not already show (metrics rows usually repeat the stats and add per-step
    # values): the median over measured steps.
    shown = set(stats_keys) | FIXED_KEYS
    metrics_keys = sorted({name[len("metrics."):] for run in runs for name in series[run.label]
                           if name.startswith("metrics.") and name[len("metrics."):] not in shown})
    for key in metrics_keys:
        details.append(make_row(f"metrics.{key} (median/step)", unit_of_key(key), per_arm(median_of(f"metrics.{key}"))))

    notes: List[str] = []
    if any(run.result.get("steps") and all(stats is None for stats in _stats_rows(run)) for run in runs):
        notes.append(f"stats is null in some runs (stock DeepSpeed has no tencache_ds.stats); their stats rows read "
                     f"{MISSING}")
    notes.append(f"medians exclude the first {warmup_steps} (warm-up) steps of each run; peaks cover all steps")
    notes.append("stage-3 fetch knobs: " + "; ".join(f"{arm}: {_stage3_knobs(by_arm[arm][0])}" for arm in arms))
    if stock_crashed:
        notes.insert(0, f"stock NVMe crashed, so its column is empty: {stock_crashed}")
    if STOCK_CPU in arms and is_number(step_time.get(STOCK_CPU)) and is_number(step_time[TENCACHE]):
        notes.insert(0, f"step time tencache / stock-cpu: {step_time[TENCACHE] / step_time[STOCK_CPU]:.3f}")
    run_dicts = [{"label": run.label, "arm": run.arm, "repeat": run.repeat, "model": run.result.get("model"),
                  "num_params": run.result.get("num_params"), "num_steps": len(run.steps)} for run in runs]
    measured = {arm: sum(max(0, len(run.steps) - warmup_steps) for run in by_arm[arm]) for arm in arms}
    return Comparison(headline, details, bound, warmup_steps, measured, losses_identical, losses_detail,
                      weights_identical, weights_detail, run_dicts, notes)


# ----------------------------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------------------------
def format_value(value: Value, unit: str) -> str:
    """A cell: bytes in binary units, seconds with 3 decimals, fractions and percents as %, counts with
    separators, None as "–"."""
    if value is None:
        return MISSING
    if isinstance(value, str) or unit == "text":
        return str(value)
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "s":
        return f"{value:.3f}"
    if unit == "fraction":
        return f"{100 * value:.1f} %"
    if unit == "percent":
        return f"{value:.1f} %"
    if unit == "times":
        return f"{value:.2f}×"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.4g}"


def format_ratio(value: Optional[float]) -> str:
    return MISSING if value is None else f"{value:.3f}"


HEADER = ("metric", STOCK, TENCACHE, "tencache/stock")


def _header(comparison: Comparison) -> Tuple[str, ...]:
    return HEADER + ((STOCK_CPU,) if comparison.has_stock_cpu else ())


def _row_notes(rows: Sequence[ComparisonRow]) -> List[str]:
    return [f"{row.name}: {row.note}" for row in rows if row.note and row.verdict is None]


def render_table(comparison: Comparison) -> str:
    """The terminal's view: the headline table (at most 12 rows), the equality details and the notes below it.
    The full table is in bench.md."""
    lines_cells = [_header(comparison)] + [row.cells(comparison.has_stock_cpu) for row in comparison.headline]
    widths = [max(len(cells[column]) for cells in lines_cells) for column in range(len(lines_cells[0]))]
    lines = []
    for index, cells in enumerate(lines_cells):
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:])]
        lines.append("  ".join([first] + rest))
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    lines.append("")
    lines.append(f"losses:  {comparison.losses_detail}")
    lines.append(f"weights: {comparison.weights_detail}")
    lines.extend(_row_notes(comparison.headline))
    lines.extend(f"note: {note}" for note in comparison.notes)
    return "\n".join(lines)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _md_table(comparison: Comparison, rows: Sequence[ComparisonRow]) -> List[str]:
    header = _header(comparison)
    out = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    out.extend("| " + " | ".join(_md_escape(cell) for cell in row.cells(comparison.has_stock_cpu)) + " |"
               for row in rows)
    return out


def render_markdown(comparison: Comparison, command_line: str, machine: Dict[str, str],
                    child_commands: Sequence[str] = (), figure_path: Optional[str] = None,
                    figure_note: str = "", constants: Sequence[str] = ()) -> str:
    """bench.md: how it was produced (command line, machine), the headline table, the equality details, the
    figure, the full table and the training commands.

    Args:
        command_line: the exact command that produced the report.
        machine: label -> description (CPU, cores, RAM, accelerator, versions).
        child_commands: the training commands that were run, in order.
        figure_path: the dashboard PNG relative to the markdown file, or None when none was written.
        figure_note: why there is no figure (with figure_path None), or a remark about it.
        constants: the series the figure leaves out because they are constant, with their values.
    """
    models = sorted({str(run.get("model")) for run in comparison.runs})
    measured = ", ".join(f"{arm} {count}" for arm, count in comparison.num_measured_steps.items())
    out = ["# tencache_ds vs stock DeepSpeed", "",
           "Produced by:", "", "```", command_line, "```", "", "## Machine", ""]
    out.extend(f"- **{_md_escape(key)}**: {_md_escape(str(value))}" for key, value in machine.items())
    out += ["", "## Results", "",
            f"Model: {', '.join(models)}; runs: {', '.join(run['label'] for run in comparison.runs)}; "
            f"measured steps: {measured} (after {comparison.warmup_steps} warm-up steps per run).", ""]
    out += _md_table(comparison, comparison.headline)
    out += ["", f"- Losses: {_md_escape(comparison.losses_detail)}",
            f"- Weights: {_md_escape(comparison.weights_detail)}"]
    out.extend(f"- {_md_escape(note)}" for note in _row_notes(comparison.headline) + comparison.notes)
    out += ["", "## Figure", ""]
    if figure_path:
        out.append(f"![dashboard]({figure_path})")
    if figure_note:
        out += ["", figure_note] if figure_path else [figure_note]
    if constants:
        out += ["", "Constant over all steps in every arm, so not drawn:", ""]
        out.extend(f"- {_md_escape(text)}" for text in constants)
    out += ["", "## Full table", ""]
    out += _md_table(comparison, comparison.details)
    notes = _row_notes(comparison.details)
    if notes:
        out.append("")
        out.extend(f"- {_md_escape(note)}" for note in notes)
    if child_commands:
        out += ["", "## Training runs", "", "```"] + list(child_commands) + ["```"]
    return "\n".join(out) + "\n"
