"""What one bench run says, step by step. Owns: the names of the arms and of the per-step quantities, loading a
run's result file and metrics lines, the per-step series (NVMe bytes from the kernel or tencache's own counters,
step time, memory, hit rates, fetch wait) and the equality of losses and weights across runs. Does not own: the
aggregation over arms (bench/report.py), the bound (bench/report_bound.py) or any rendering
(bench/report_render.py). Pure; imports neither torch nor deepspeed.

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
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .records import read_json_record

STOCK = "stock"
TENCACHE = "tencache"
ARMS = (STOCK, TENCACHE)
# Optional third arm (`bench --compare cpu`): stock DeepSpeed with offload device "cpu" and DeepSpeed's default
# stage-3 fetch knobs (train.py --stage3-defaults), the rest of the config as given -- what a user whose host memory
# holds the model would pick. Its bits must equal stock NVMe's.
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
FIXED_KEYS = frozenset(STEP_SERIES) | {PINNED_PEAK_KEY, "nvme_read_bytes_per_step", "nvme_write_bytes_per_step",
                                        "nvme_write_bytes_per_day"}  # a row of its own, from the headline's bytes
METRICS_STEP_KEY = "step"  # the step number in a metrics row; not a metric
# Wall-clock stamps in metrics rows ("time_unix_s"): not comparable between runs.
TIMESTAMP_KEY = re.compile(r"unix|timestamp|wall_clock", re.IGNORECASE)

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


# ----------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------
def load_result(path: str) -> Dict[str, Any]:
    """A result file written by scripts/train.py, plain or archived (bench/records.py). Raises ValueError naming the
    file when it is not one."""
    try:
        result = read_json_record(path)
    except ValueError as err:  # it names the file read: the plain one or its archive
        raise ValueError(f"not a JSON result file: {err}") from None
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

