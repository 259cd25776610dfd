"""Comparison of stock DeepSpeed and tencache_ds runs. Owns: per-step series from result dicts, their aggregation
over measured steps and repeats, the I/O-compute bound, bytes moved over the least bytes, and the comparison's
text, markdown and JSON forms (a headline of at most 12 rows, then the full table). Does not own: launching runs,
reading the machine, measuring the NVMe path (tencache_ds/cli/bench.py) or the figure (bench/dashboard.py). Pure;
imports neither torch nor deepspeed.

The comparison is spread over four modules by section; this one aggregates, and re-exports the others' public
names so that ``report.X`` keeps working:

- bench/report_runs.py: the arms, loading a run, its per-step series, equality of losses and weights;
- bench/report_bound.py: the drive's rates, the least compute, a run's least bytes, the bound;
- bench/report_render.py: rows, the comparison as data, the table and bench.md;
- bench/report.py (this one): the headline's rows, the aggregation over repeats and arms (compare), bytes over
  the least bytes (never below 1), what each arm costs the drive.
"""
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..drive_wear import bytes_written_per_day, days_to_rated_tbw, fmt_days, fmt_decimal_tb
from ..plan.least_bytes import LeastBytes
from ..plan.workload import stage3_key
from ..units import fmt_bytes
from .report_bound import (Bound, NvmeBandwidth, compute_bound, least_compute,  # noqa: F401 (re-exported)
                           run_least_bytes)
from .report_render import (HEADER, WEAR_BYTES, Comparison, ComparisonRow, format_ratio,  # noqa: F401
                            format_value, render_markdown, render_table)
from .report_runs import (ARMS, DEVICE_HIT, FETCH_WAIT, FIXED_KEYS, HOST_HIT, MISSING, NVME_READ,  # noqa: F401
                          NVME_WRITE, PEAK_RSS, PINNED, PINNED_PEAK_KEY, STEP_SERIES, STEP_TIME, STOCK, STOCK_CPU,
                          TENCACHE, BenchRun, Value, _max, _measured, _median, _stats_rows, compare_losses,
                          compare_weights, is_number, load_metrics_rows, load_result, nvme_per_step,
                          own_nvme_per_step, per_step_deltas, run_series, step_series)

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
ROW_VS_LEAST = "NVMe bytes / least bytes"
ROW_IDENTICAL = "identical losses / weights"
HEADLINE_ROWS = (ROW_STEP_TIME, ROW_BOUND, ROW_VS_BOUND, ROW_PINNED, ROW_PEAK_RSS, ROW_NVME_READ, ROW_NVME_WRITE,
                 ROW_VS_LEAST, ROW_DEVICE_HIT, ROW_HOST_HIT, ROW_FETCH_WAIT, ROW_IDENTICAL)
ROW_FETCH_SHARE = "fetch wait (% of step time)"  # the first row of the full table
ROW_WRITTEN_PER_DAY = "NVMe written / day at the measured rate"
ROW_DAYS_TO_TBW = "days to the drive's rated TBW"
MAX_HEADLINE_ROWS = 12

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
    # (each knob under its stage3_ alias or its field's name, which DeepSpeed takes too)
    keys = [stage3_key(zero, alias[len("stage3_"):]) for alias in STAGE3_FETCH_KNOBS]
    chosen = [f"{key.removeprefix('stage3_')}={zero[key]:g}" if is_number(zero[key]) else f"{key}={zero[key]}"
              for key in keys if key in zero]
    return ", ".join(chosen) + " (the rest DeepSpeed's defaults)" if chosen else "DeepSpeed's defaults"


def _final_loss_bits(runs: Sequence[BenchRun]) -> Optional[str]:
    steps = runs[0].steps if runs else []
    return steps[-1].get("loss_bits") if steps else None


def _yes_no(identical: bool) -> str:
    return "yes" if identical else "NO"


def least_bytes_of(runs: Sequence[BenchRun], warmup_steps: int = 0
                   ) -> Tuple[Optional[LeastBytes], Dict[str, LeastBytes], str]:
    """The least NVMe bytes per step over tencache's runs (the smallest run's: a bound for every repeat), per store,
    for the budgets of their measured steps, and where they come from; (None, {}, why) when no run has them."""
    found = [(run_least_bytes(run, warmup_steps), run) for run in runs]
    usable = [(stores, source) for (stores, source), _run in found if stores]
    if not usable:
        return None, {}, found[0][0][1] if found else "no tencache run"
    # the smallest by the figure the ratio divides by (by total_bytes alone, a run with another budget could be
    # taken whose read + written is the larger: helper-205)
    stores, source = min(usable, key=lambda item: least_total(sum(item[0].values(), LeastBytes(0, 0, 0, 0, 0, 0))))
    total = sum(stores.values(), LeastBytes(0, 0, 0, 0, 0, 0))
    return total, stores, source


def least_total(least: LeastBytes) -> int:
    """The least bytes read and written a step: reads and writes are bounded together and apart, and the larger
    bound of the two holds."""
    return max(least.total_bytes, least.read_bytes + least.write_bytes)


def least_bytes_ratio(moved: Value, least: Optional[LeastBytes], source: str) -> Tuple[Optional[float], str]:
    """bytes moved / least bytes, and its note. Never below 1: a run that moved fewer bytes than its least has a
    wrong least, and the note says so instead."""
    if least is None:
        return None, f"no least bytes: {source}"
    if not is_number(moved):
        return None, "tencache's own bytes per step are unknown"
    least_bytes = least_total(least)
    if least_bytes == 0:
        return None, ("nothing has to move: the budgets hold every tensor" if moved == 0 else
                      f"{fmt_bytes(moved)} moved where the budgets hold every tensor ({source})")
    if moved < least_bytes:
        return None, (f"no ratio: tencache moved {fmt_bytes(moved)} per step, below the least {fmt_bytes(least_bytes)} "
                      f"its budgets allow, so the least is wrong (its profile does not describe the measured "
                      f"steps, or the budgets in the stats are not the ones the run had): {source}")
    return moved / least_bytes, (f"{fmt_bytes(moved)} per step (tencache's own counters, read + written) over the "
                                 f"least {fmt_bytes(least_bytes)} ({fmt_bytes(least.read_bytes)} read, "
                                 f"{fmt_bytes(least.write_bytes)} written) for {source}")


def _moved_over_own_least(runs: Sequence[BenchRun], own: Dict[str, Dict[str, list]], warmup_steps: int,
                          no_least: str) -> Tuple[Optional[float], str]:
    """tencache's bytes moved per step over the least, each run's median over its own least (the least follows the
    budgets a run chose: repeats whose "auto" budgets differed were set one run's bytes over another's least,
    helper-226), then the median over the runs; none where any run has no ratio (its note is said)."""
    if not runs:
        return least_bytes_ratio(None, None, no_least)
    found = []
    for run in runs:
        stores, source = run_least_bytes(run, warmup_steps)
        read, write = (_median(_measured(own[direction][run.label], warmup_steps)) for direction in ("read", "write"))
        moved = read + write if is_number(read) and is_number(write) else None
        found.append(least_bytes_ratio(moved, sum(stores.values(), LeastBytes(0, 0, 0, 0, 0, 0)) if stores else None,
                                       source))
    missing = [note for ratio, note in found if ratio is None]
    if missing:
        return None, missing[0]
    if len(found) == 1:
        return found[0]
    each = ", ".join(f"{ratio:.2f}" for ratio, _note in found)
    return _median([ratio for ratio, _note in found]), \
        f"the median of {len(found)} runs' own ratios ({each}); the first: {found[0][1]}"


def _refuse_unless_tencache_ran(run: BenchRun) -> None:
    """A tencache run whose steps say tencache was not enabled ran stock (a training script that never imported
    tencache_ds, or dropped the block: TENCACHE_BENCH_TRAIN_SCRIPT), or could not say (tencache_ds.stats failed):
    compared as tencache, it gave stock's numbers a tencache column and ratios (helper-241). A script that reports
    no stats at all cannot say, and is taken at its word."""
    for index, step in enumerate(run.steps):
        stats = step.get("stats") or {}
        if "stats_error" in stats:
            raise ValueError(f"{run.label}: tencache_ds.stats failed at step {index}: {stats['stats_error']}")
        if stats.get("tencache_enabled", 1) != 1:
            raise ValueError(f"{run.label} did not run tencache (step {index}: tencache_enabled "
                             f"{stats.get('tencache_enabled')!r}): its training script must import tencache_ds and "
                             f"pass the config's \"tencache\" block on to deepspeed.initialize")


def compare(runs: Sequence[BenchRun], warmup_steps: int, nvme_bandwidth: Optional[NvmeBandwidth] = None,
            stock_crashed: Optional[str] = None, drive_tbw_bytes: Optional[float] = None,
            ranks_per_drive: int = 1) -> Comparison:
    """Aggregate the runs of each arm (stock, tencache, and stock-cpu when it ran) into the comparison.

    Per arm: step time, per-step bytes, hit rates and fetch waits are the median of all measured steps of all its
    repeats; peaks (pinned memory, RSS) are the maximum over all steps; stats keys without a row of their own show
    the median over repeats of the value after the last step; metrics keys show the median over measured steps.
    The bound uses ``nvme_bandwidth`` (None: its NVMe part is missing), the least bytes of the tencache runs'
    profiles (least_bytes_of) and the stock-cpu step time.
    ``stock_crashed``: stock NVMe did not finish (what it died of); its column then reads "–", and tencache is
    compared with stock CPU offload, which must have run. ``drive_tbw_bytes``: the drive's rated endurance; each
    arm's NVMe bytes written per day at its measured rate (per rank) are reported with it or without, the days it
    lasts only with it, ``ranks_per_drive`` ranks writing to it (drive_wear.py).

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
    for run in by_arm[TENCACHE]:
        _refuse_unless_tencache_ran(run)
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
    measured_steps = {arm: [step for run in by_arm[arm]
                            for step in _measured(series[run.label].get(STEP_TIME, []), warmup_steps)]
                      for arm in arms}
    tencache_pairs = [pair for run in by_arm[TENCACHE] for pair in
                      list(zip(series[run.label].get(STEP_TIME, []), series[run.label].get(FETCH_WAIT, [])))[
                          warmup_steps:]]
    compute_s, compute_source = least_compute(measured_steps.get(STOCK_CPU, []), tencache_pairs)
    least, least_by_store, least_source = least_bytes_of(by_arm[TENCACHE], warmup_steps)
    bound = compute_bound(least.read_bytes if least else None, least.write_bytes if least else None, nvme_bandwidth,
                          compute_s, compute_source, io_missing=f"no least bytes per step: {least_source}",
                          ranks_per_drive=ranks_per_drive)
    own = {direction: {run.label: own_nvme_per_step(run, direction)[0] for run in runs}
           for direction in ("read", "write")}
    own_moved = {direction: per_arm(lambda rs, d=direction: _median([value for run in rs for value in
                                                                    _measured(own[d][run.label], warmup_steps)]))
                 for direction in ("read", "write")}
    vs_least, vs_least_note = _moved_over_own_least(by_arm[TENCACHE], own, warmup_steps, least_source)
    vs_bound = (step_time[TENCACHE] / bound.seconds if bound.seconds and is_number(step_time[TENCACHE]) else None)
    vs_bound_note = ""
    fastest = min(measured_steps[TENCACHE], default=None)
    if vs_bound is not None and fastest is not None and fastest < bound.seconds:
        # a step measured below its bound means the bound is wrong (a rate below what the drive did, a compute
        # part above what the step needs): say so, never print a ratio against it (any measured step, not the
        # median: helper-205)
        vs_bound, vs_bound_note = None, (f"no ratio: a measured step ({fastest:.3f} s) is below the bound, so the "
                                         f"bound is wrong: {_why_below(bound)}")
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
        ComparisonRow(ROW_VS_LEAST, "times", None, vs_least, note=vs_least_note),
        make_row(ROW_DEVICE_HIT, "fraction", per_arm(median_of(DEVICE_HIT))),
        make_row(ROW_HOST_HIT, "fraction", per_arm(median_of(HOST_HIT))),
        make_row(ROW_FETCH_WAIT, "s", fetch_wait),
        ComparisonRow(ROW_IDENTICAL, "text", _final_loss_bits(by_arm[STOCK]), _final_loss_bits(by_arm[TENCACHE]),
                      verdict=f"{_yes_no(losses_identical)} / {_yes_no(weights_identical)}",
                      stock_cpu=_final_loss_bits(by_arm[STOCK_CPU])),
    ]
    assert [row.name for row in headline] == list(HEADLINE_ROWS) and len(headline) <= MAX_HEADLINE_ROWS

    # ---- the full table: everything else
    details = [make_row(ROW_FETCH_SHARE, "percent",
                        {arm: _share_percent(fetch_wait[arm], step_time[arm]) for arm in arms},
                        note="the median fetch wait over the median step time"),
               make_row("pinned bytes peak in use (stats, max)", "bytes", per_arm(max_of(f"stats.{PINNED_PEAK_KEY}")))]
    if any(own_nvme_per_step(run, "read")[1] != "none" for run in runs):  # tencache's own view beside the kernel's
        for direction in ("read", "write"):
            details.append(make_row(f"NVMe {direction} bytes/step (tencache's own counters, median)", "bytes",
                                    own_moved[direction]))
    for store, store_least in sorted(least_by_store.items()):  # what each store moved, beside its least
        store_moved = _store_moved(by_arm[TENCACHE], series, store, warmup_steps)
        details.append(ComparisonRow(f"NVMe bytes/step, {store} (tencache's own counters, median)", "bytes", None,
                                     store_moved))
        details.append(ComparisonRow(f"least NVMe bytes/step, {store}", "bytes", None,
                                     max(store_least.total_bytes, store_least.read_bytes + store_least.write_bytes),
                                     note=f"{fmt_bytes(store_least.read_bytes)} read + "
                                          f"{fmt_bytes(store_least.write_bytes)} written at the least, of "
                                          f"{fmt_bytes(store_least.all_read_bytes)} + "
                                          f"{fmt_bytes(store_least.all_write_bytes)} with nothing kept, "
                                          f"budget {fmt_bytes(store_least.capacity_bytes)}"))
    written_per_day = {arm: bytes_written_per_day(nvme["write"][arm], step_time[arm])
                       if is_number(nvme["write"][arm]) and is_number(step_time[arm]) else None for arm in arms}
    details.append(make_row(ROW_WRITTEN_PER_DAY, WEAR_BYTES, written_per_day,
                            note="the median NVMe bytes written per step at the median step's rate, per rank"))
    days = {arm: days_to_rated_tbw(nvme["write"][arm], step_time[arm], drive_tbw_bytes, ranks_per_drive)
            if drive_tbw_bytes and is_number(nvme["write"][arm]) and is_number(step_time[arm]) else None
            for arm in arms}
    if drive_tbw_bytes:
        details.append(make_row(ROW_DAYS_TO_TBW, "text", {arm: fmt_days(value) for arm, value in days.items()},
                                note=f"a {fmt_decimal_tb(drive_tbw_bytes)} rating, {ranks_per_drive} rank(s) "
                                     f"writing to it"))
    if any(is_number(run.result.get("init_time_s")) for run in runs):
        details.append(make_row("engine start-up (s)", "s", per_arm(lambda rs: _arm_top_level(rs, "init_time_s"))))
    if any(_nvme_footprint(run) is not None for run in runs):
        details.append(make_row("swap files on NVMe after the run", "bytes", per_arm(
            lambda rs: _median([value for value in map(_nvme_footprint, rs) if value is not None]))))
    # Every metrics key, whatever features add later (a step's own number, or a gauge at its end): the median over
    # measured steps. The stats repeat the last step's metrics under the same names
    # (integrations/deepspeed/stats.py), one sample where the median of every measured step is known.
    metrics_keys = sorted({name[len("metrics."):] for run in runs for name in series[run.label]
                           if name.startswith("metrics.")} - FIXED_KEYS)
    # Every other stats key: the value after the last step.
    stats_keys = sorted({key for run in runs for stats in _stats_rows(run) if stats for key, value in stats.items()
                         if (is_number(value) or isinstance(value, str))} - FIXED_KEYS - set(metrics_keys))
    for key in stats_keys:
        values = per_arm(lambda rs: _arm_final(rs, key))
        unit = "text" if any(isinstance(value, str) for value in values.values()) else unit_of_key(key)
        details.append(make_row(f"stats.{key} (after last step)", unit, values))
    for key in metrics_keys:
        details.append(make_row(f"metrics.{key} (median/step)", unit_of_key(key), per_arm(median_of(f"metrics.{key}"))))

    notes: List[str] = []
    if any(run.result.get("steps") and all(stats is None for stats in _stats_rows(run)) for run in runs):
        notes.append(f"stats is null in some runs (stock DeepSpeed has no tencache_ds.stats); their stats rows read "
                     f"{MISSING}")
    notes.append(f"medians exclude the first {warmup_steps} (warm-up) steps of each run; peaks cover all steps")
    if ranks_per_drive > 1:  # (scripts/train.py records rank 0's; the losses are the ranks' mean)
        notes.append(f"{ranks_per_drive} ranks: memory, NVMe bytes and tencache's figures are rank 0's, not the "
                     f"node's; the bound's NVMe part moves every rank's bytes")
    notes.append("stage-3 fetch knobs: " + "; ".join(f"{arm}: {_stage3_knobs(by_arm[arm][0])}" for arm in arms))
    notes.insert(0, _wear_note(arms, written_per_day, days, drive_tbw_bytes, ranks_per_drive))
    if stock_crashed:  # its other repeats were skipped; one that finished before the crash is in its column
        notes.insert(0, f"stock NVMe crashed, so its column is empty: {stock_crashed}" if not by_arm.get(STOCK) else
                     f"stock NVMe crashed, so its column is from {len(by_arm[STOCK])} finished run(s): "
                     f"{stock_crashed}")
    if STOCK_CPU in arms and is_number(step_time.get(STOCK_CPU)) and is_number(step_time[TENCACHE]):
        notes.insert(0, f"step time tencache / stock-cpu: {step_time[TENCACHE] / step_time[STOCK_CPU]:.3f}")
    run_dicts = [{"label": run.label, "arm": run.arm, "repeat": run.repeat, "model": run.result.get("model"),
                  "num_params": run.result.get("num_params"), "num_steps": len(run.steps)} for run in runs]
    measured = {arm: sum(max(0, len(run.steps) - warmup_steps) for run in by_arm[arm]) for arm in arms}
    return Comparison(headline, details, bound, warmup_steps, measured, losses_identical, losses_detail,
                      weights_identical, weights_detail, run_dicts, notes)


def _wear_note(arms: Sequence[str], written_per_day: Dict[str, Value], days: Dict[str, Value],
               drive_tbw_bytes: Optional[float], ranks_per_drive: int) -> str:
    """What each arm costs the drive at its measured rate (decimal TB, as drive ratings are given)."""
    rates = ", ".join(f"{arm} {fmt_decimal_tb(written_per_day[arm])}" for arm in arms
                      if is_number(written_per_day[arm]))
    note = f"drive wear (NVMe written per day of training at the measured rate, per rank): {rates or MISSING}"
    if drive_tbw_bytes:
        lasts = ", ".join(f"{arm} {fmt_days(days[arm])}" for arm in arms if days[arm] is not None)
        note += (f"; days to the drive's rated {fmt_decimal_tb(drive_tbw_bytes)} with {ranks_per_drive} rank(s) "
                 f"writing to it: {lasts or MISSING}")
    else:
        note += " (--drive-tbw: the days until the drive's rating)"
    return note


def _why_below(bound: Bound) -> str:
    """Why a step can come out below its bound: the part that limits it overstates what the step needs."""
    if bound.limited_by == "compute":
        return f"its compute part ({bound.compute_source}) is more than the step's work needs"
    return ("its NVMe part is more than the step needs: the drive moved bytes faster than measured "
            f"({bound.bandwidth.speeds() if bound.bandwidth else 'no rates'}), or fewer bytes than the least")


STORE_STATS_PREFIX = {"params": "param", "optimizer": "optimizer"}


def _store_moved(runs: Sequence[BenchRun], series, store: str, warmup_steps: int) -> Optional[float]:
    """The median over measured steps of what one store read and wrote (its stats' running totals, per step)."""
    prefix = STORE_STATS_PREFIX[store]
    values = []
    for run in runs:
        reads = per_step_deltas(series[run.label].get(f"stats.{prefix}_nvme_read_bytes", []))
        writes = per_step_deltas(series[run.label].get(f"stats.{prefix}_nvme_write_bytes", []))
        both = [read + write if read is not None and write is not None else None for read, write in zip(reads, writes)]
        values += _measured(both, warmup_steps)
    return _median(values)
