"""Drive wear: how fast NVMe writes use up a drive's rated endurance (TBW). Owns: the one formula, shared by the
estimate (predicted writes, plan/step_model/results.py), the per-step metrics and the bench (measured writes).
Pure.

Offload users pay in drive wear and rarely see it: DeepSpeed logs a one-time TBW warning and counts no bytes.
Written bytes per day at a step's rate are a fact of the run; days until a drive's rating need the rating, which
no drive reports (datasheets give it: e.g. 1 drive write per day for 5 years)."""
import math
from typing import Optional

SECONDS_PER_DAY = 86400.0


def bytes_written_per_day(write_bytes_per_step: Optional[float], step_s: Optional[float]) -> Optional[float]:
    """Bytes one writer puts on its drive per day of continuous training at this step's rate (None without a step
    time)."""
    if step_s is None or write_bytes_per_step is None or step_s <= 0:
        return None
    return write_bytes_per_step * SECONDS_PER_DAY / step_s


def days_to_rated_tbw(write_bytes_per_step: Optional[float], step_s: Optional[float],
                      drive_tbw_bytes: Optional[float], writers_per_drive: float = 1.0) -> Optional[float]:
    """Days of continuous training until a drive has absorbed ``drive_tbw_bytes`` when ``writers_per_drive`` ranks
    (the node's ranks over its drives, evenly) each write ``write_bytes_per_step`` per step. None without a rating
    or a positive step time; inf when nothing is written."""
    per_day = bytes_written_per_day(write_bytes_per_step, step_s)
    if not drive_tbw_bytes or per_day is None:
        return None
    if per_day <= 0:
        return math.inf
    return drive_tbw_bytes / (per_day * writers_per_drive)


def fmt_decimal_tb(nbytes: float) -> str:
    """Bytes in decimal terabytes, as drive ratings are given: "600 TB", "1,200 TB", "0.4 TB", "54.01 TB"."""
    tb = nbytes / 1e12
    return f"{tb:,.0f} TB" if tb >= 100 or tb == int(tb) else f"{tb:,.2f} TB" if tb >= 1 else f"{tb:.2g} TB"


def fmt_days(days: Optional[float]) -> str:
    """Days to a rating: "never" when nothing is written, "–" when unknown."""
    if days is None:
        return "–"
    return "never" if math.isinf(days) else f"{days:,.1f}"


__all__ = ["SECONDS_PER_DAY", "bytes_written_per_day", "days_to_rated_tbw", "fmt_decimal_tb", "fmt_days"]
