"""The comparison's forms. Owns: a row and the whole comparison as data (ComparisonRow, Comparison, and their JSON),
how a value is shown in a cell, the terminal's table and bench.md. Does not own: what the rows hold
(bench/report.py). Pure."""
import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..drive_wear import fmt_decimal_tb
from ..units import fmt_bytes
from .report_bound import Bound
from .report_runs import MISSING, STOCK, STOCK_CPU, TENCACHE, Value

WEAR_BYTES = "bytes (shown in decimal TB)"  # a unit: the value is bytes, shown as drive ratings are given


@dataclasses.dataclass(frozen=True)
class ComparisonRow:
    """One line of the comparison. ``unit`` is "s", "bytes", WEAR_BYTES (bytes shown in decimal TB), "count",
    "fraction" (shown as %), "percent", "times" or "text". ``verdict`` replaces the ratio cell for rows that compare
    equality (losses, weights). ``stock_cpu`` is the third arm's value (None when that arm did not run or has no
    such value)."""

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
# Rendering
# ----------------------------------------------------------------------------------------------------------------
def format_value(value: Value, unit: str) -> str:
    """A cell: bytes in binary units (drive wear in decimal TB), seconds with 3 decimals, fractions and percents
    as %, counts with separators, None as "–"."""
    if value is None:
        return MISSING
    if isinstance(value, str) or unit == "text":
        return str(value)
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == WEAR_BYTES:  # drive wear: in the units drive ratings (TBW) are given in
        return fmt_decimal_tb(value)
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
