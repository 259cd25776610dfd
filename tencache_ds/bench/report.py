"""Comparison of stock DeepSpeed and tencache_ds runs. Owns: per-step series from result dicts, their aggregation
over measured steps and repeats, the I/O-compute bound, and the comparison's text, markdown and JSON forms (a
headline of at most 12 rows, then the full table). Does not own: launching runs, reading the machine, measuring
the NVMe path (tencache_ds/cli/bench.py) or the figure (bench/dashboard.py). Pure; imports neither torch nor
deepspeed.

The comparison is spread over four modules by section; this one aggregates, and re-exports the others' public
names so that ``report.X`` keeps working:

- bench/report_runs.py: the arms, loading a run, its per-step series, equality of losses and weights;
- bench/report_bound.py: the drive's rates, the least compute, the bound;
- bench/report_render.py: rows, the comparison as data, the table and bench.md;
- bench/report.py (this one): the headline's rows, the aggregation over repeats and arms (compare).
"""
from typing import Callable, Dict, List, Optional, Sequence

from .report_bound import Bound, NvmeBandwidth, compute_bound, least_compute  # noqa: F401 (re-exported)
from .report_render import (HEADER, Comparison, ComparisonRow, format_ratio, format_value,  # noqa: F401
                            render_markdown, render_table)
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
ROW_FETCH_SHARE = "fetch wait (% of step time)"
ROW_IDENTICAL = "identical losses / weights"
HEADLINE_ROWS = (ROW_STEP_TIME, ROW_BOUND, ROW_VS_BOUND, ROW_PINNED, ROW_PEAK_RSS, ROW_NVME_READ, ROW_NVME_WRITE,
                 ROW_DEVICE_HIT, ROW_HOST_HIT, ROW_FETCH_WAIT, ROW_FETCH_SHARE, ROW_IDENTICAL)
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
