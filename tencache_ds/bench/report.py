"""Comparison of stock DeepSpeed and tencache_ds runs. Owns: per-step series from result dicts, their aggregation
over measured steps and repeats, the comparison table (text, markdown, JSON) and the plots. Does not own: launching
runs, reading the machine or choosing configs (tencache_ds/cli/bench.py). Pure apart from write_plots, which writes
PNG files; imports neither torch nor deepspeed (matplotlib only inside write_plots).

The inputs follow the result contract of scripts/train.py:

    result = {label, model, num_params, ds_config, init_time_s?, nvme_usage?, weights_sha256, ...,
              steps: [{step, loss, loss_bits, time_s, peak_rss_bytes, io_read_bytes, io_write_bytes, stats}]}

- ``io_*_bytes`` are this step's /proc/self/io deltas; ``peak_rss_bytes`` is the process peak so far.
- ``stats`` is ``tencache_ds.stats(engine)`` after the step (a flat dict) or None. Its counters (``nvme_read_bytes``
  and the like) are totals since the engine started (a Counter's ``total``, style.md 8.6), so a step's value is the
  difference from the previous step; the first step's difference includes what engine start-up did.
- metrics rows (the JSON lines the tencache block writes to ``metrics_path``) are one flat dict per optimizer step.

Warm-up steps are the first ``warmup_steps`` entries of each run; they are excluded from medians but drawn in plots.
"""
import dataclasses
import json
import math
import os
import re
import statistics
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ..units import fmt_bytes

STOCK = "stock"
TENCACHE = "tencache"
ARMS = (STOCK, TENCACHE)
# Optional third arm (`bench --compare cpu`): stock DeepSpeed with offload device "cpu", same config otherwise --
# what a user whose host memory holds the model would pick. Its bits must equal stock NVMe's.
STOCK_CPU = "stock-cpu"

# Stats keys that have their own rows (and plots); every other key gets a generic row.
PINNED_RESERVED_KEY = "pinned_bytes_reserved"
PINNED_PEAK_KEY = "pinned_bytes_peak_in_use"
NVME_READ_KEY = "nvme_read_bytes"
NVME_WRITE_KEY = "nvme_write_bytes"
FIXED_STATS_KEYS = frozenset({PINNED_RESERVED_KEY, PINNED_PEAK_KEY, NVME_READ_KEY, NVME_WRITE_KEY})
METRICS_STEP_KEY = "step"  # the step number in a metrics row; not a metric
# Wall-clock stamps in metrics rows ("time_unix_s"): neither comparable between runs nor worth a plot.
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


@dataclasses.dataclass(frozen=True)
class ComparisonRow:
    """One line of the comparison. ``unit`` is "s", "bytes", "count" or "text". ``verdict`` replaces the ratio cell
    for rows that compare equality (losses, weights)."""

    name: str
    unit: str
    stock: Value
    tencache: Value
    ratio: Optional[float] = None
    verdict: Optional[str] = None
    note: str = ""

    def cells(self) -> Tuple[str, str, str, str]:
        ratio_cell = self.verdict if self.verdict is not None else format_ratio(self.ratio)
        return self.name, format_value(self.stock, self.unit), format_value(self.tencache, self.unit), ratio_cell


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Everything the table, markdown and JSON outputs show. ``losses_identical``/``weights_identical`` cover every
    run of both arms (so repeats of one arm are checked against each other too)."""

    rows: List[ComparisonRow]
    warmup_steps: int
    num_measured_steps: Dict[str, int]
    losses_identical: bool
    losses_detail: str
    weights_identical: bool
    weights_detail: str
    runs: List[Dict[str, Any]]
    notes: List[str]

    def row(self, name: str) -> ComparisonRow:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no row named {name!r}; rows: {[r.name for r in self.rows]}")

    def to_dict(self) -> Dict[str, Any]:
        rows = []
        for row in self.rows:
            _, stock_cell, tencache_cell, ratio_cell = row.cells()
            rows.append({"name": row.name, "unit": row.unit, "stock": row.stock, "tencache": row.tencache,
                         "ratio": row.ratio, "verdict": row.verdict, "note": row.note,
                         "cells": {"stock": stock_cell, "tencache": tencache_cell, "ratio": ratio_cell}})
        return {"warmup_steps": self.warmup_steps, "num_measured_steps": self.num_measured_steps,
                "losses_identical": self.losses_identical, "losses_detail": self.losses_detail,
                "weights_identical": self.weights_identical, "weights_detail": self.weights_detail,
                "runs": self.runs, "notes": self.notes, "rows": rows}


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


def run_series(run: BenchRun) -> Dict[str, List[Optional[float]]]:
    """Every per-step numeric series of a run, each as long as the run's step list (None where missing).

    Names: "step_time_s", "peak_rss_bytes", "io_read_bytes", "io_write_bytes"; "nvme_read_bytes_per_step" and
    "nvme_write_bytes_per_step" (differences of the stats counters, when present); "stats.<key>" for every numeric
    stats key (the value after the step) and "metrics.<key>" for every numeric metrics key.
    """
    steps = run.steps

    def field(name: str, source: Iterable[Optional[Dict[str, Any]]]) -> List[Optional[float]]:
        return [float(row[name]) if row and is_number(row.get(name)) else None for row in source]

    series: Dict[str, List[Optional[float]]] = {
        "step_time_s": field("time_s", steps),
        "peak_rss_bytes": field("peak_rss_bytes", steps),
        "io_read_bytes": field("io_read_bytes", steps),
        "io_write_bytes": field("io_write_bytes", steps),
    }
    stats_rows = [step.get("stats") if isinstance(step.get("stats"), dict) else None for step in steps]
    stats_keys = sorted({key for row in stats_rows if row for key, value in row.items() if is_number(value)})
    for key in stats_keys:
        series[f"stats.{key}"] = field(key, stats_rows)
    for key, name in ((NVME_READ_KEY, "nvme_read_bytes_per_step"), (NVME_WRITE_KEY, "nvme_write_bytes_per_step")):
        if f"stats.{key}" in series:
            series[name] = per_step_deltas(series[f"stats.{key}"])
    metrics_rows = _aligned_metrics(run)
    metrics_keys = sorted({key for row in metrics_rows if row for key, value in row.items()
                           if is_number(value) and key != METRICS_STEP_KEY and not TIMESTAMP_KEY.search(key)})
    for key in metrics_keys:
        series[f"metrics.{key}"] = field(key, metrics_rows)
    return series


def _measured(values: Sequence[Optional[float]], warmup_steps: int) -> List[float]:
    return [value for value in values[warmup_steps:] if value is not None]


def _pooled(runs: Sequence[BenchRun], name: str, warmup_steps: int) -> List[float]:
    """The measured (post-warm-up) values of series ``name`` from all ``runs`` together."""
    pooled: List[float] = []
    for run in runs:
        pooled.extend(_measured(run_series(run).get(name, []), warmup_steps))
    return pooled


def _all_steps_max(runs: Sequence[BenchRun], name: str) -> Optional[float]:
    values = [value for run in runs for value in run_series(run).get(name, []) if value is not None]
    return max(values) if values else None


def _median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


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


def _numeric_row(name: str, unit: str, stock: Value, tencache: Value, note: str = "") -> ComparisonRow:
    return ComparisonRow(name, unit, stock, tencache, ratio(stock, tencache), None, note)


def unit_of_key(key: str) -> str:
    """Display unit guessed from a metric name: "..._bytes..." -> bytes, "..._s" -> seconds, else a count."""
    lowered = key.lower()
    if "bytes" in lowered:
        return "bytes"
    if lowered.endswith("_s") or lowered.endswith("_seconds"):
        return "s"
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


def compare(runs: Sequence[BenchRun], warmup_steps: int) -> Comparison:
    """Aggregate stock and tencache runs into the comparison table.

    Per arm: step time and per-step bytes are the median of all measured steps of all its repeats; peaks are the
    maximum over all steps; stats keys without a row of their own show the median over repeats of the value after
    the last step; metrics keys show the median over measured steps.

    Raises:
        ValueError: no run of an arm, or warm-up leaves no measured step.
    """
    by_arm = {arm: [run for run in runs if run.arm == arm] for arm in ARMS}
    for arm, arm_runs in by_arm.items():
        if not arm_runs:
            raise ValueError(f"no {arm} run to compare (runs: {[run.label for run in runs]})")
        for run in arm_runs:
            if len(run.steps) <= warmup_steps:
                raise ValueError(f"{run.label} has {len(run.steps)} steps, all within the {warmup_steps} warm-up "
                                 "steps; run more steps or lower --warmup")
    stock, tencache = by_arm[STOCK], by_arm[TENCACHE]
    notes: List[str] = []
    rows: List[ComparisonRow] = []

    def both(fn) -> Tuple[Value, Value]:
        return fn(stock), fn(tencache)

    rows.append(_numeric_row("median step time (s)", "s",
                             *both(lambda rs: _median(_pooled(rs, "step_time_s", warmup_steps)))))
    rows.append(_numeric_row("peak RSS", "bytes", *both(lambda rs: _all_steps_max(rs, "peak_rss_bytes"))))
    rows.append(_numeric_row("pinned bytes reserved (stats, max)", "bytes",
                             *both(lambda rs: _all_steps_max(rs, f"stats.{PINNED_RESERVED_KEY}"))))
    rows.append(_numeric_row("pinned bytes peak in use (stats, max)", "bytes",
                             *both(lambda rs: _all_steps_max(rs, f"stats.{PINNED_PEAK_KEY}"))))

    # NVMe traffic: the plugin's counters where the arm has them, else what the kernel saw the process do.
    any_stats_nvme = False
    for direction in ("read", "write"):
        values, sources = [], []
        for arm_runs in (stock, tencache):
            from_stats = _pooled(arm_runs, f"nvme_{direction}_bytes_per_step", warmup_steps)
            if from_stats:
                values.append(_median(from_stats))
                sources.append("stats")
                any_stats_nvme = True
            else:
                values.append(_median(_pooled(arm_runs, f"io_{direction}_bytes", warmup_steps)))
                sources.append("/proc/self/io")
        rows.append(_numeric_row(f"NVMe {direction} bytes/step (median)", "bytes", values[0], values[1],
                                 note=f"stock: {sources[0]}; tencache: {sources[1]}"))
    if any_stats_nvme:  # the kernel's view too, measured the same way for both arms
        for direction in ("read", "write"):
            rows.append(_numeric_row(f"process disk {direction} bytes/step (/proc/self/io, median)", "bytes",
                                     *both(lambda rs: _median(_pooled(rs, f"io_{direction}_bytes", warmup_steps)))))

    stock_cpu = [run for run in runs if run.arm == STOCK_CPU]
    if stock_cpu:
        cpu_time = _median(_pooled(stock_cpu, "step_time_s", warmup_steps))
        tencache_time = _median(_pooled(tencache, "step_time_s", warmup_steps))
        rows.insert(1, ComparisonRow("median step time vs stock CPU offload (s)", "s", cpu_time, tencache_time,
                                     tencache_time / cpu_time if is_number(cpu_time) and cpu_time else None,
                                     note="stock column: stock DeepSpeed with offload device cpu"))
        rows.insert(2, _numeric_row("peak RSS vs stock CPU offload", "bytes", _all_steps_max(stock_cpu, "peak_rss_bytes"),
                                    _all_steps_max(tencache, "peak_rss_bytes")))
    losses_identical, losses_detail = compare_losses(list(stock) + list(tencache) + stock_cpu)
    weights_identical, weights_detail = compare_weights(list(stock) + list(tencache) + stock_cpu)
    rows.append(ComparisonRow("losses identical (all steps, loss_bits)", "text",
                              _final_loss_bits(stock[0]), _final_loss_bits(tencache[0]), None,
                              "yes" if losses_identical else "NO", losses_detail))
    rows.append(ComparisonRow("final weights identical (sha256)", "text",
                              _short_digest(stock[0]), _short_digest(tencache[0]), None,
                              "yes" if weights_identical else "NO", weights_detail))

    if any(is_number(run.result.get("init_time_s")) for run in runs):
        rows.append(_numeric_row("engine start-up (s)", "s", *both(lambda rs: _arm_top_level(rs, "init_time_s"))))
    if any(_nvme_footprint(run) is not None for run in runs):
        rows.append(_numeric_row("swap files on NVMe after the run", "bytes",
                                 *both(lambda rs: _median([v for v in map(_nvme_footprint, rs) if v is not None]))))

    # Every other stats key, whatever features add later: the value after the last step.
    stats_keys = sorted({key for run in runs for step in run.steps if isinstance(step.get("stats"), dict)
                         for key, value in step["stats"].items()
                         if (is_number(value) or isinstance(value, str)) and key not in FIXED_STATS_KEYS})
    for key in stats_keys:
        stock_value, tencache_value = both(lambda rs: _arm_final(rs, key))
        unit = "text" if isinstance(stock_value, str) or isinstance(tencache_value, str) else unit_of_key(key)
        rows.append(_numeric_row(f"stats.{key} (after last step)", unit, stock_value, tencache_value))
    # Every metrics key the stats do not already show (metrics rows usually repeat the stats and add per-step
    # values): the median over measured steps.
    all_stats_keys = set(stats_keys) | FIXED_STATS_KEYS
    metrics_keys = sorted({name[len("metrics."):] for run in runs for name in run_series(run)
                           if name.startswith("metrics.") and name[len("metrics."):] not in all_stats_keys})
    for key in metrics_keys:
        rows.append(_numeric_row(f"metrics.{key} (median/step)", unit_of_key(key),
                                 *both(lambda rs: _median(_pooled(rs, f"metrics.{key}", warmup_steps)))))

    if any(run.result.get("steps") and all(step.get("stats") is None for step in run.steps) for run in runs):
        notes.append("stats is null in some runs (stock DeepSpeed has no tencache_ds.stats); their stats rows read n/a")
    notes.append(f"medians exclude the first {warmup_steps} (warm-up) steps of each run; peaks cover all steps")
    run_dicts = [{"label": run.label, "arm": run.arm, "repeat": run.repeat, "model": run.result.get("model"),
                  "num_params": run.result.get("num_params"), "num_steps": len(run.steps)} for run in runs]
    measured = {arm: sum(max(0, len(run.steps) - warmup_steps) for run in by_arm[arm]) for arm in ARMS}
    if stock_cpu:
        measured[STOCK_CPU] = sum(max(0, len(run.steps) - warmup_steps) for run in stock_cpu)
    return Comparison(rows, warmup_steps, measured, losses_identical, losses_detail, weights_identical,
                      weights_detail, run_dicts, notes)


def _final_loss_bits(run: BenchRun) -> Optional[str]:
    steps = run.steps
    return f"last {steps[-1].get('loss_bits')}" if steps else None


def _short_digest(run: BenchRun) -> Optional[str]:
    digest = run.result.get("weights_sha256")
    return f"{digest[:12]}…" if digest else None


# ----------------------------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------------------------
def format_value(value: Value, unit: str) -> str:
    """A cell: bytes in binary units, seconds with 3 decimals, counts with separators, None as n/a."""
    if value is None:
        return "n/a"
    if isinstance(value, str) or unit == "text":
        return str(value)
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "s":
        return f"{value:.3f}"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.4g}"


def format_ratio(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.3f}"


HEADER = ("metric", STOCK, TENCACHE, "tencache/stock")


def render_table(comparison: Comparison) -> str:
    """A plain-text table for the terminal, with the equality details and notes below it."""
    lines_cells = [HEADER] + [row.cells() for row in comparison.rows]
    widths = [max(len(cells[column]) for cells in lines_cells) for column in range(4)]
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
    for row in comparison.rows:
        if row.note and row.verdict is None:
            lines.append(f"{row.name}: {row.note}")
    lines.extend(f"note: {note}" for note in comparison.notes)
    return "\n".join(lines)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(comparison: Comparison, command_line: str, machine: Dict[str, str],
                    plot_paths: Sequence[str] = (), child_commands: Sequence[str] = ()) -> str:
    """bench.md: how it was produced (command line, machine), the table, the equality details and the plots.

    Args:
        command_line: the exact command that produced the report.
        machine: label -> description (CPU, cores, RAM, accelerator, versions).
        plot_paths: PNG paths relative to the markdown file.
        child_commands: the training commands that were run, in order.
    """
    models = sorted({str(run.get("model")) for run in comparison.runs})
    out = ["# tencache_ds vs stock DeepSpeed", "",
           "Produced by:", "", "```", command_line, "```", "", "## Machine", ""]
    out.extend(f"- **{_md_escape(key)}**: {_md_escape(str(value))}" for key, value in machine.items())
    out += ["", "## Results", "",
            f"Model: {', '.join(models)}; runs: {', '.join(run['label'] for run in comparison.runs)}; "
            f"measured steps: stock {comparison.num_measured_steps[STOCK]}, "
            f"tencache {comparison.num_measured_steps[TENCACHE]} (after {comparison.warmup_steps} warm-up steps "
            "per run).", "",
            "| " + " | ".join(HEADER) + " |", "| --- | ---: | ---: | ---: |"]
    out.extend("| " + " | ".join(_md_escape(cell) for cell in row.cells()) + " |" for row in comparison.rows)
    out += ["", f"- Losses: {_md_escape(comparison.losses_detail)}",
            f"- Weights: {_md_escape(comparison.weights_detail)}"]
    out.extend(f"- {_md_escape(row.name)}: {_md_escape(row.note)}" for row in comparison.rows
               if row.note and row.verdict is None)
    out.extend(f"- {_md_escape(note)}" for note in comparison.notes)
    if child_commands:
        out += ["", "## Training runs", "", "```"] + list(child_commands) + ["```"]
    if plot_paths:
        out += ["", "## Plots", ""]
        out.extend(f"![{os.path.splitext(os.path.basename(path))[0]}]({path})" for path in plot_paths)
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------------------------
ARM_COLORS = {STOCK: "tab:blue", TENCACHE: "tab:orange"}
SERIES_STYLES = ("-", "--", ":", "-.")   # one per series drawn in the same panel
REPEAT_MARKERS = ("o", "s", "^", "x", "d")
MIB = 1024 ** 2
FIXED_PLOT_SERIES = frozenset({f"stats.{key}" for key in FIXED_STATS_KEYS})


@dataclasses.dataclass(frozen=True)
class Panel:
    """One subplot: the series to draw for every run, each as (series name, legend suffix)."""

    title: str
    ylabel: str
    series: Tuple[Tuple[str, str], ...]
    scale: float = 1.0


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "metric"


def _draw(path: str, runs: Sequence[BenchRun], panels: Sequence[Panel], warmup_steps: int) -> bool:
    """One PNG with the panels stacked; every run is a line per series (arm = colour, series = line style,
    repeat = marker). Returns False, writing nothing, when no run has a value of any of the series."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series_by_run = [(run, run_series(run)) for run in runs]
    figure = Figure(figsize=(6.4, 1.0 + 2.6 * len(panels)), dpi=100)
    FigureCanvasAgg(figure)
    drawn_any = False
    for panel_index, panel in enumerate(panels):
        axes = figure.add_subplot(len(panels), 1, panel_index + 1)
        drawn = False
        for run, all_series in series_by_run:
            for series_index, (name, suffix) in enumerate(panel.series):
                values = all_series.get(name)
                if not values or all(value is None for value in values):
                    continue
                points = [(index, value / panel.scale) for index, value in enumerate(values) if value is not None]
                axes.plot([p[0] for p in points], [p[1] for p in points], SERIES_STYLES[series_index % 4],
                          marker=REPEAT_MARKERS[(run.repeat - 1) % len(REPEAT_MARKERS)], markersize=3,
                          color=ARM_COLORS.get(run.arm), label=f"{run.label}{suffix}")
                drawn = True
        if drawn and warmup_steps > 0:
            axes.axvspan(-0.5, warmup_steps - 0.5, color="0.9", label="warm-up")
        axes.set_title(panel.title, fontsize="medium")
        axes.set_xlabel("step")
        axes.set_ylabel(panel.ylabel)
        axes.grid(True, alpha=0.3)
        if drawn:
            axes.legend(fontsize="x-small")
        drawn_any = drawn_any or drawn
    if not drawn_any:
        return False
    figure.tight_layout()
    figure.savefig(path)
    return True


def write_plots(runs: Sequence[BenchRun], out_dir: str, warmup_steps: int) -> List[str]:
    """Write the PNG plots into ``out_dir`` and return their paths: step_time.png, peak_rss.png, pinned_memory.png,
    nvme_bytes.png, and metrics/<name>.png for every other numeric per-step series (stats.*, and metrics.* keys
    the stats do not have). A plot whose series no run has is skipped.

    Raises:
        ImportError: matplotlib is not installed (the message says how to install it or skip plots).
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ImportError("plots need matplotlib: pip install matplotlib (or pass --no-plots)") from err
    os.makedirs(out_dir, exist_ok=True)
    written: List[str] = []

    def plot(filename: str, *panels: Panel) -> None:
        path = os.path.join(out_dir, filename)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if _draw(path, runs, panels, warmup_steps):
            written.append(path)

    plot("step_time.png", Panel("step time", "seconds", (("step_time_s", ""),)))
    plot("peak_rss.png", Panel("peak RSS", "MiB", (("peak_rss_bytes", ""),), MIB))
    plot("pinned_memory.png", Panel("pinned host memory (tencache_ds.stats)", "MiB",
                                    ((f"stats.{PINNED_RESERVED_KEY}", " reserved"),
                                     (f"stats.{PINNED_PEAK_KEY}", " peak in use")), MIB))
    plot("nvme_bytes.png", *[
        Panel(f"NVMe {direction} bytes per step", "MiB",
              ((f"nvme_{direction}_bytes_per_step", " (stats)"), (f"io_{direction}_bytes", " (/proc/self/io)")), MIB)
        for direction in ("read", "write")])

    names = {name for run in runs for name in run_series(run)}
    stats_keys = {name[len("stats."):] for name in names if name.startswith("stats.")} | FIXED_STATS_KEYS
    other = sorted(name for name in names if name not in FIXED_PLOT_SERIES and (
        name.startswith("stats.") or (name.startswith("metrics.") and name[len("metrics."):] not in stats_keys)))
    for name in other:
        is_bytes = unit_of_key(name) == "bytes"
        plot(os.path.join("metrics", _safe_name(name) + ".png"),
             Panel(name, "MiB" if is_bytes else "value", ((name, ""),), MIB if is_bytes else 1.0))
    return written
