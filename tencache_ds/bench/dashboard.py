"""The bench's one figure, dashboard.png: one panel per question (how long is a step, how much NVMe traffic, how
much host memory, do fetches hit and how long do they wait), every arm in each. Owns: which panels and series are
drawn (plan_dashboard, pure) and the drawing (write_dashboard). Does not own: the per-step numbers
(bench/report.py step_series, the same ones the headline aggregates). matplotlib is optional (the `bench` extra)
and imported only inside write_dashboard.

A series that is constant over all steps in every arm (pinned memory usually is) is not drawn: its values are
named under its panel and listed in bench.md instead. A panel left with nothing to draw is left out.
"""
import dataclasses
import importlib.util
import math
from typing import Dict, List, Optional, Sequence, Tuple

from . import report
from .report import BenchRun

FETCH_SHARE = "fetch_wait_share"  # derived per step: 100 * fetch_wait_s / step_time_s
ARM_COLORS = {report.STOCK: "tab:blue", report.TENCACHE: "tab:orange", report.STOCK_CPU: "tab:green"}
LINE_STYLES = ("-", "--", ":")          # one per series of a panel
REPEAT_MARKERS = ("o", "s", "^", "x", "d")
BYTE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))


@dataclasses.dataclass(frozen=True)
class Series:
    """One line per run: ``key`` in report.step_series (or FETCH_SHARE); ``unit`` as report.format_value takes it."""

    key: str
    label: str
    unit: str


@dataclasses.dataclass(frozen=True)
class Panel:
    """One question, its series sharing one y axis (``unit``: "s", "bytes" or "percent")."""

    title: str
    unit: str
    series: Tuple[Series, ...]


PANELS = (
    Panel("step time per step", "s", (Series(report.STEP_TIME, "step time", "s"),)),
    Panel("NVMe traffic per step", "bytes", (Series(report.NVME_READ, "read", "bytes"),
                                             Series(report.NVME_WRITE, "written", "bytes"))),
    Panel("host memory", "bytes", (Series(report.PINNED, "pinned", "bytes"),
                                   Series(report.PEAK_RSS, "peak RSS", "bytes"))),
    Panel("hit rates and fetch wait", "percent", (Series(report.DEVICE_HIT, "device hit rate", "fraction"),
                                                  Series(report.HOST_HIT, "host hit rate", "fraction"),
                                                  Series(FETCH_SHARE, "fetch wait, % of step", "percent"))),
)


@dataclasses.dataclass(frozen=True)
class PlannedPanel:
    """A panel to draw: the series that vary, and a text per series left out because it is constant."""

    panel: Panel
    drawn: Tuple[Series, ...]
    constants: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class DashboardPlan:
    """``panels``: those with at least one series to draw, in PANELS order. ``constants``: every constant series
    with its value per arm, left-out panels included (for bench.md)."""

    panels: Tuple[PlannedPanel, ...]
    constants: Tuple[str, ...]


def matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def panel_series(run: BenchRun) -> Dict[str, List[Optional[float]]]:
    """report.step_series plus the fetch wait as a share of each step's time, in percent."""
    series = report.step_series(run)
    series[FETCH_SHARE] = [100.0 * wait / step if wait is not None and step else None
                           for wait, step in zip(series[report.FETCH_WAIT], series[report.STEP_TIME])]
    return series


def _distinct(values: Sequence[float]) -> bool:
    """Whether ``values`` hold more than one value (up to float noise)."""
    low, high = min(values), max(values)
    return high - low > 1e-9 * max(1.0, abs(high))


def plan_dashboard(runs: Sequence[BenchRun]) -> DashboardPlan:
    """Which series each panel draws. A series no run has is dropped silently (stock has no hit rates, so in a
    stock-only world that panel is simply absent); one that has a single value per arm over all steps is dropped
    with a text naming those values."""
    by_label = {run.label: panel_series(run) for run in runs}
    arms = [arm for arm in (report.STOCK, report.TENCACHE, report.STOCK_CPU) if any(run.arm == arm for run in runs)]
    planned, all_constants = [], []
    for panel in PANELS:
        drawn, constants = [], []
        for series in panel.series:
            values_by_arm = {arm: [value for run in runs if run.arm == arm for value in by_label[run.label][series.key]
                                   if value is not None] for arm in arms}
            present = {arm: values for arm, values in values_by_arm.items() if values}
            if not present:
                continue
            if any(_distinct(values) for values in present.values()):
                drawn.append(series)
                continue
            constants.append(f"{series.label}: " + ", ".join(
                f"{arm} {report.format_value(values[0], series.unit)}" for arm, values in present.items()))
        all_constants.extend(f"{panel.title}, {text}" for text in constants)
        if drawn:
            planned.append(PlannedPanel(panel, tuple(drawn), tuple(constants)))
    return DashboardPlan(tuple(planned), tuple(all_constants))


def _axis(panel: Panel, peak: float) -> Tuple[float, str]:
    """(divide values by, y-axis label) for a panel whose largest drawn value is ``peak``."""
    if panel.unit == "bytes":
        name, size = next(((name, size) for name, size in BYTE_UNITS if peak >= size), BYTE_UNITS[-1])
        return float(size), name
    if panel.unit == "percent":
        return 1.0, "%"
    return 1.0, "seconds"


def write_dashboard(plan: DashboardPlan, runs: Sequence[BenchRun], path: str, warmup_steps: int,
                    title: str = "") -> bool:
    """Draw ``plan`` to the PNG ``path``: arm = colour, series = line style, repeat = marker, warm-up steps shaded.
    Returns False, writing nothing, when the plan has no panel.

    Raises:
        ImportError: matplotlib is not installed (check matplotlib_available() first).
    """
    if not plan.panels:
        return False
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    by_label = {run.label: panel_series(run) for run in runs}
    num_columns = 1 if len(plan.panels) == 1 else 2
    num_rows = math.ceil(len(plan.panels) / num_columns)
    figure = Figure(figsize=(6.4 * num_columns, 1.0 + 3.4 * num_rows), dpi=100)
    FigureCanvasAgg(figure)
    for index, planned in enumerate(plan.panels):
        last_alone = num_columns == 2 and index == len(plan.panels) - 1 and index % 2 == 0
        # an odd last panel spans the row, rather than leaving an empty cell beside it
        axes = figure.add_subplot(num_rows, num_columns, (index + 1, index + 2) if last_alone else index + 1)
        # percent panels draw fractions (hit rates) x100
        factors = {series.key: 100.0 if series.unit == "fraction" else 1.0 for series in planned.drawn}
        peak = max((abs(value) * factors[series.key] for run in runs for series in planned.drawn
                    for value in by_label[run.label][series.key] if value is not None), default=0.0)
        divisor, ylabel = _axis(planned.panel, peak)
        for run in runs:
            for series_index, series in enumerate(planned.drawn):
                points = [(step, value * factors[series.key] / divisor)
                          for step, value in enumerate(by_label[run.label][series.key]) if value is not None]
                if not points:
                    continue
                axes.plot([point[0] for point in points], [point[1] for point in points],
                          linestyle=LINE_STYLES[series_index % len(LINE_STYLES)],
                          marker=REPEAT_MARKERS[(run.repeat - 1) % len(REPEAT_MARKERS)], markersize=3,
                          color=ARM_COLORS.get(run.arm), label=f"{run.arm} {series.label}" if run.repeat == 1 else None)
        if warmup_steps > 0:
            axes.axvspan(-0.5, warmup_steps - 0.5, color="0.92", zorder=0, label="warm-up")
        axes.set_title(planned.panel.title, fontsize="medium")
        axes.set_xlabel("step" + "".join(f"\nconstant, not drawn: {text}" for text in planned.constants),
                        fontsize="small")
        axes.set_ylabel(ylabel)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        if planned.panel.unit != "s":
            axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="x-small")
    repeats = max(run.repeat for run in runs)
    if title or repeats > 1:
        markers = f" (repeats: markers {' '.join(REPEAT_MARKERS[:repeats])})" if repeats > 1 else ""
        figure.suptitle(title + markers, fontsize="medium")
    figure.tight_layout()
    figure.savefig(path)
    return True
