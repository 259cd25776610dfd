"""tencache_ds/bench/report.py and bench/dashboard.py on hand-made result dicts (the scripts/train.py result
contract): medians leave out warm-up steps, ratios, loss/weight equality, the headline and its bound, the stock-cpu
column, old and new metrics files, generic stats and metrics rows, rendering and the figure. No DeepSpeed."""
import dataclasses
import importlib.util
import json
import os
import re
import types

import pytest

from tencache_ds.bench import dashboard, report
from tencache_ds.bench.report import BenchRun, compare
from tencache_ds.profile.step_profile import StepProfile
from tencache_ds.profile.store import save_section

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_result(times_s, loss_bits=None, stats=None, sha="a" * 64, io_read=None, io_write=None, **top_level):
    """A result dict as scripts/train.py writes it. ``stats`` is a list of dicts (or None) per step."""
    num_steps = len(times_s)
    loss_bits = loss_bits or [f"0x{0x40000000 + step:08x}" for step in range(num_steps)]
    stats = stats or [None] * num_steps
    io_read = io_read or [1000] * num_steps
    io_write = io_write or [2000] * num_steps
    steps = [{"step": step, "loss": 7.0, "loss_bits": loss_bits[step], "time_s": times_s[step],
              "peak_rss_bytes": (100 + step) << 20, "io_read_bytes": io_read[step], "io_write_bytes": io_write[step],
              "stats": stats[step]} for step in range(num_steps)]
    return dict({"label": "x", "model": "gpt2-tiny", "num_params": 123, "ds_config": {}, "steps": steps,
                 "weights_sha256": sha, "torch_version": "t", "deepspeed_version": "d"}, **top_level)


def test_median_excludes_warmup_steps():
    """Scenario: slow warm-up steps must not reach the median step time."""
    # Step 1: two runs whose first two steps are very slow.
    stock = BenchRun("stock", 1, make_result([10.0, 10.0, 1.0, 2.0, 3.0]))
    tencache = BenchRun("tencache", 1, make_result([20.0, 20.0, 0.5, 1.0, 1.5]))
    # Step 2: with warmup 2, only steps 2..4 count: medians 2.0 and 1.0 (with warm-up they would be 3.0 and 1.5).
    comparison = compare([stock, tencache], warmup_steps=2)
    row = comparison.row(report.ROW_STEP_TIME)
    assert row.stock == 2.0 and row.tencache == 1.0
    # Step 3: the ratio is tencache / stock.
    assert row.ratio == pytest.approx(0.5)
    assert comparison.num_measured_steps == {"stock": 3, "tencache": 3}
    # Step 4: with no warm-up the slow steps do count.
    assert compare([stock, tencache], warmup_steps=0).row(report.ROW_STEP_TIME).stock == 3.0


def test_repeats_are_pooled_per_arm():
    """Scenario: two repeats of each arm; the median is over all measured steps of the arm's repeats."""
    runs = [BenchRun("stock", 1, make_result([9.0, 1.0, 1.0])), BenchRun("tencache", 1, make_result([9.0, 4.0, 4.0])),
            BenchRun("stock", 2, make_result([9.0, 3.0, 3.0])), BenchRun("tencache", 2, make_result([9.0, 6.0, 6.0]))]
    row = compare(runs, warmup_steps=1).row(report.ROW_STEP_TIME)
    # stock pooled [1, 1, 3, 3] -> 2; tencache pooled [4, 4, 6, 6] -> 5
    assert (row.stock, row.tencache) == (2.0, 5.0)
    assert row.ratio == pytest.approx(2.5)


def test_ratio_math():
    assert report.ratio(4, 2) == pytest.approx(0.5)
    assert report.ratio(2, 4) == pytest.approx(2.0)
    assert report.ratio(0, 4) is None          # no ratio to a zero
    assert report.ratio(None, 4) is None
    assert report.ratio(4, "native") is None
    assert report.format_ratio(0.5) == "0.500" and report.format_ratio(None) == "–"


def test_identical_loss_bits_and_weights_are_detected():
    """Scenario: both arms produce the same loss bits and weights."""
    runs = [BenchRun("stock", 1, make_result([1.0] * 4)), BenchRun("tencache", 1, make_result([1.0] * 4))]
    comparison = compare(runs, warmup_steps=1)
    assert comparison.losses_identical and comparison.weights_identical
    assert comparison.row(report.ROW_IDENTICAL).verdict == "yes / yes"


def test_different_loss_bits_are_detected_and_located():
    """Scenario: the tencache run's loss differs in the last bit at step 2 (a warm-up step counts too)."""
    # Step 1: same losses except step 2.
    bits = [f"0x{0x40000000 + step:08x}" for step in range(4)]
    other = list(bits)
    other[2] = "0x40000003"
    runs = [BenchRun("stock", 1, make_result([1.0] * 4, loss_bits=bits)),
            BenchRun("tencache", 1, make_result([1.0] * 4, loss_bits=other))]
    # Step 2: the comparison says NO and names the run and the step.
    comparison = compare(runs, warmup_steps=3)
    assert not comparison.losses_identical
    assert comparison.row(report.ROW_IDENTICAL).verdict == "NO / yes"
    assert "tencache-1 step 2" in comparison.losses_detail


def test_different_step_counts_and_weights_are_detected():
    runs = [BenchRun("stock", 1, make_result([1.0] * 4, sha="a" * 64)),
            BenchRun("tencache", 1, make_result([1.0] * 3, sha="b" * 64))]
    identical, detail = report.compare_losses(runs)
    assert not identical and "3 steps" in detail
    identical, detail = report.compare_weights(runs)
    assert not identical and "tencache-1" in detail
    # Regression guard: a repeat of the same arm that differs is caught too.
    runs = [BenchRun("stock", 1, make_result([1.0] * 3)), BenchRun("stock", 2, make_result([1.0] * 3, sha="c" * 64))]
    assert report.compare_weights(runs)[0] is False


def test_unknown_stats_and_metrics_keys_get_rows():
    """Scenario: a later feature adds stats and metrics keys that report.py has never heard of."""
    # Step 1: tencache stats with new keys (a counter, a byte gauge, a string); metrics rows repeat one stats key
    # and add a per-step-only key.
    stats = [{"pinned_bytes_reserved": 4096, "brand_new_counter": step, "fancy_cache_bytes": 1024 * (step + 1),
              "arena_backend": "native"} for step in range(3)]
    metrics = tuple({"step": step, "brand_new_counter": step, "prefetch_late_per_step": 10 * step,
                     "time_unix_s": 1.7e9 + step} for step in range(3))
    runs = [BenchRun("stock", 1, make_result([1.0] * 3)),
            BenchRun("tencache", 1, make_result([1.0] * 3, stats=stats), metrics)]
    comparison = compare(runs, warmup_steps=1)
    names = [row.name for row in comparison.rows]
    # Step 2: every new stats key has a row with the value after the last step; units follow the name.
    fancy = comparison.row("stats.fancy_cache_bytes (after last step)")
    assert fancy.tencache == 3072 and fancy.cells()[2] == "3.00 KiB" and fancy.cells()[1] == "–"
    assert comparison.row("stats.arena_backend (after last step)").tencache == "native"
    # Step 3: a metrics key has a median-per-step row (steps 1, 2 -> 10, 20 -> 15), also where the stats repeat the
    # last step's value under its name (they do for every metrics key: integrations/deepspeed/stats.py): the median,
    # not that one sample (steps 1, 2 -> 1, 2 -> 1.5, where the stats' last value is 2), with no second row; wall-clock
    # stamps get none.
    assert comparison.row("metrics.prefetch_late_per_step (median/step)").tencache == 15
    assert comparison.row("metrics.brand_new_counter (median/step)").tencache == 1.5
    assert "stats.brand_new_counter (after last step)" not in names
    assert not any("time_unix" in name for name in names)
    # Step 4: the new keys reach bench.md's full table, not the terminal's headline.
    markdown = report.render_markdown(comparison, "tencache-ds bench", {})
    assert "metrics.brand_new_counter" in markdown and "metrics.prefetch_late_per_step" in markdown
    assert "brand_new_counter" not in report.render_table(comparison)


def test_nvme_bytes_per_step_come_from_one_source_for_every_arm():
    """Scenario: both arms have the kernel's /proc/self/io counts; tencache also counts its own (running totals in
    its stats). The headline compares the arms on the same source; tencache's own view is a row of the full table."""
    # Step 1: tencache's totals 100, 300, 600, 1000 -> per step 100, 200, 300, 400; measured (warm-up 1) median 300.
    stats = [{"nvme_read_bytes": total, "nvme_write_bytes": 2 * total} for total in (100, 300, 600, 1000)]
    runs = [BenchRun("stock", 1, make_result([1.0] * 4, io_read=[5, 7, 9, 11], io_write=[1, 1, 1, 1])),
            BenchRun("tencache", 1, make_result([1.0] * 4, stats=stats))]
    comparison = compare(runs, warmup_steps=1)
    read = comparison.row(report.ROW_NVME_READ)
    # Step 2: both arms from /proc/self/io (stock: median of 7, 9, 11; tencache: make_result's 1000 a step).
    assert (read.stock, read.tencache) == (9.0, 1000.0)
    assert read.note == "from stock: /proc/self/io; tencache: /proc/self/io"
    # Step 3: tencache's own counters (the stats deltas) in the full table; stock has none.
    own = comparison.row("NVMe read bytes/step (tencache's own counters, median)")
    assert (own.stock, own.tencache) == (None, 300.0)
    assert comparison.row("NVMe write bytes/step (tencache's own counters, median)").tencache == 600.0


def test_nvme_bytes_per_step_from_tencaches_counters_where_the_kernel_has_none():
    stats = [{"nvme_read_bytes": total, "nvme_write_bytes": 2 * total} for total in (100, 300, 600, 1000)]
    result = make_result([1.0] * 4, stats=stats)
    for step in result["steps"]:
        step.pop("io_read_bytes"), step.pop("io_write_bytes")
    assert report.nvme_per_step(BenchRun("tencache", 1, result), "read") == ([100, 200, 300, 400], "stats")


def test_io_counters_the_kernel_does_not_give_are_missing_not_zero(tmp_path):
    """Scenario: a machine whose /proc/self/io cannot be read (no task I/O accounting, a container hiding it).
    scripts/train.py records no I/O bytes for its steps; the headline then takes tencache's own counters and shows no
    figure for stock, not 0 bytes and a drive that is never worn out."""
    spec = importlib.util.spec_from_file_location("proc_io", os.path.join(REPO, "scripts", "proc_io.py"))
    proc_io = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(proc_io)
    # Step 1: the counters, read and not.
    assert proc_io.read_proc_io(str(tmp_path / "no-such-file")) is None
    (tmp_path / "io").write_text("rchar: 5\nwchar: 6\n")  # a kernel that counts characters, not storage bytes
    assert proc_io.read_proc_io(str(tmp_path / "io")) is None
    readable = os.access("/proc/self/io", os.R_OK)  # (not where a container hides it: what this test is about)
    assert (set(proc_io.read_proc_io()) == {"read_bytes", "write_bytes"}) if readable else proc_io.read_proc_io() is None
    assert proc_io.io_delta(None, {"read_bytes": 5}, "read_bytes") is None
    assert proc_io.io_delta({"read_bytes": 2}, {"read_bytes": 5}, "read_bytes") == 3
    # Step 2: steps recorded that way (None), both arms.
    stats = [{"nvme_read_bytes": total, "nvme_write_bytes": 2 * total} for total in (100, 300, 600, 1000)]
    missing = [None] * 4
    runs = [BenchRun("stock", 1, make_result([1.0] * 4)), BenchRun("tencache", 1, make_result([1.0] * 4, stats=stats))]
    for run in runs:
        for step in run.result["steps"]:
            step["io_read_bytes"] = step["io_write_bytes"] = None
    assert report.nvme_per_step(runs[0], "write") == (missing, "none")
    comparison = compare(runs, warmup_steps=1, drive_tbw_bytes=600e12)
    written = comparison.row(report.ROW_NVME_WRITE)
    assert written.stock is None and written.tencache == 600.0  # tencache's own count: median of 400, 600, 800
    assert comparison.row(report.ROW_DAYS_TO_TBW).stock in (None, report.MISSING)


def test_per_step_deltas():
    assert report.per_step_deltas([10, 30, 60]) == [10, 20, 30]
    assert report.per_step_deltas([10, None, 60, 70]) == [10, None, None, 10]


def test_peaks_and_pinned_memory_cover_all_steps():
    stats = [{"pinned_bytes_reserved": value, "pinned_bytes_peak_in_use": value // 2} for value in (900, 100, 100)]
    runs = [BenchRun("stock", 1, make_result([1.0] * 3)), BenchRun("tencache", 1, make_result([1.0] * 3, stats=stats))]
    comparison = compare(runs, warmup_steps=2)
    assert comparison.row(report.ROW_PINNED).tencache == 900
    assert comparison.row(report.ROW_PINNED).stock is None
    assert comparison.row(report.ROW_PEAK_RSS).stock == 102 << 20


def test_compare_rejects_runs_without_measured_steps_or_without_an_arm():
    runs = [BenchRun("stock", 1, make_result([1.0] * 2)), BenchRun("tencache", 1, make_result([1.0] * 2))]
    with pytest.raises(ValueError, match="warm-up"):
        compare(runs, warmup_steps=2)
    with pytest.raises(ValueError, match="no tencache run"):
        compare(runs[:1], warmup_steps=0)


def test_markdown_json_and_table_rendering():
    stats = [{"odd|key_bytes": 10}] * 3
    runs = [BenchRun("stock", 1, make_result([1.0] * 3, init_time_s=9.0)),
            BenchRun("tencache", 1, make_result([2.0] * 3, stats=stats, init_time_s=3.0))]
    comparison = compare(runs, warmup_steps=1)
    markdown = report.render_markdown(comparison, "tencache-ds bench --steps 3", {"CPU": "Test CPU, 2 cores"},
                                      ["python train.py --label stock-1"], "dashboard.png", "",
                                      ["host memory, pinned: stock 1.00 GiB"])
    assert "```\ntencache-ds bench --steps 3\n```" in markdown
    assert "- **CPU**: Test CPU, 2 cores" in markdown
    assert "| step time (s, median) | 1.000 | 2.000 | 2.000 |" in markdown
    assert "odd\\|key_bytes" in markdown  # a pipe in a key does not break the table
    assert "![dashboard](dashboard.png)" in markdown and "- host memory, pinned: stock 1.00 GiB" in markdown
    # the headline table comes first, the full table after it
    assert markdown.index("| step time (s, median) |") < markdown.index("## Full table") < \
        markdown.index("| engine start-up (s) |")
    assert comparison.row("engine start-up (s)").ratio == pytest.approx(1 / 3)
    decoded = json.loads(json.dumps(comparison.to_dict()))
    assert decoded["losses_identical"] is True
    assert [row["name"] for row in decoded["headline"]] == list(report.HEADLINE_ROWS)
    assert "engine start-up (s)" in {row["name"] for row in decoded["details"]}
    table = report.render_table(comparison)
    assert table.splitlines()[0].split() == ["metric", "stock", "tencache", "tencache/stock"]
    # no figure: bench.md says why
    assert "No figure: matplotlib is not installed" in report.render_markdown(
        comparison, "x", {}, figure_note="No figure: matplotlib is not installed")


def test_load_result_and_metrics_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        report.load_result(str(bad))
    no_steps = tmp_path / "no_steps.json"
    no_steps.write_text("{}")
    with pytest.raises(ValueError, match="steps"):
        report.load_result(str(no_steps))
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"step": 0, "a": 1}\n\n{"step": 1, "a": 2}\n')
    assert report.load_metrics_rows(str(metrics)) == ({"step": 0, "a": 1}, {"step": 1, "a": 2})
    assert report.load_metrics_rows(str(tmp_path / "missing.jsonl")) == ()


# ----------------------------------------------------------------------------------------------------------------
# The headline, the bound and the stock-cpu column
# ----------------------------------------------------------------------------------------------------------------
GB = 10 ** 9


def schema_rows(num_steps, read=(0,), write=(0,), device_hit=(0.9,), host_hit=(1.0,), fetch_wait=(0.1,),
                pinned=(1 << 20,)):
    """Metrics rows as the tencache block writes them under schema "tencache.metrics/1" (per-step NVMe bytes);
    each tuple is cycled over the steps."""
    def at(values, step):
        return values[step % len(values)]
    return tuple({"schema": "tencache.metrics/1", "step": step, "step_time_s": 1.0, "time_unix_s": 1.7e9 + step,
                  "nvme_read_bytes": at(read, step), "nvme_write_bytes": at(write, step),
                  "device_hit_rate": at(device_hit, step), "host_hit_rate": at(host_hit, step),
                  "fetch_wait_s": at(fetch_wait, step), "prefetch_issued": 10, "prefetch_late": 1,
                  "pinned_bytes_reserved": at(pinned, step), "pinned_bytes_in_use": 1 << 19,
                  "host_cache_bytes_in_use": 1 << 30, "device_cache_bytes_in_use": 0} for step in range(num_steps))


def three_arms(stock_cpu_times=(1.5, 1.5, 1.5, 1.5), profile_dir=None, param_budget=0, param_keeps_copies=None,
               tencache_times=(9.0, 2.0, 2.0, 2.0)):
    """stock (3 s steps), tencache (2 s steps, 1 GB read + 0.5 GB written per step, new metrics) and stock-cpu.
    ``profile_dir``: tencache saved its profile there: one 0.5 GB parameter used twice a step (forward and
    backward), so with a ``param_budget`` of 0 it must read 1 GB and write 0.5 GB (its new bytes) every step.
    ``param_keeps_copies``: the stat of that name (None: a record from before it)."""
    stats = [{"pinned_bytes_reserved": 64 << 20, "param_reserved_bytes": param_budget} for _ in range(4)]
    if param_keeps_copies is not None:
        for row in stats:
            row["param_keeps_copies"] = param_keeps_copies
    top_level = {}
    if profile_dir is not None:
        path = str(profile_dir / "tencache-1.profile.json")
        save_section(path, "params", "f" * 16, StepProfile.untimed(["a", "a"], [GB // 2, GB // 2]))
        top_level["ds_config"] = {"tencache": {"enabled": True, "profile_path": path}}
    return [BenchRun("stock", 1, make_result([9.0, 3.0, 3.0, 3.0], stats=[{"pinned_bytes_reserved": 2 << 30}] * 4,
                                             io_read=[5 * GB] * 4, io_write=[4 * GB] * 4)),
            BenchRun("tencache", 1, make_result(list(tencache_times), stats=stats, io_read=[GB] * 4,
                                                io_write=[GB // 2] * 4, **top_level),
                     schema_rows(4, read=(GB,), write=(GB // 2,), fetch_wait=(0.5,))),
            BenchRun("stock-cpu", 1, make_result([9.0] + list(stock_cpu_times[1:]), io_read=[0] * 4,
                                                 io_write=[0] * 4))]


def test_headline_has_at_most_12_rows_and_the_named_ones():
    """Scenario: a three-arm comparison; the terminal shows the headline only, bench.md the rest too."""
    # Step 1: the headline rows, in order, and no more than 12 of them.
    comparison = compare(three_arms(), warmup_steps=1, nvme_bandwidth=report.NvmeBandwidth(GB, GB, "test"))
    names = [row.name for row in comparison.headline]
    assert names == list(report.HEADLINE_ROWS) and len(names) <= 12
    assert {"step time (s, median)", "bound (s)", "step time / bound", "pinned host memory (max)", "peak host RSS",
            "NVMe read / step (median)", "NVMe written / step (median)", "device hit rate (median)",
            "host hit rate (median)", "fetch wait (s/step, median)", "NVMe bytes / least bytes",
            "identical losses / weights"} == set(names)
    # Step 2: the terminal table is the header, a rule and exactly those rows; no full-table row reaches it.
    table = report.render_table(comparison).split("\n\n")[0].splitlines()
    assert len(table) == 2 + len(names)
    assert [line.split("  ")[0].strip() for line in table[2:]] == names
    assert "engine start-up" not in report.render_table(comparison)
    # Step 3: the new per-step metrics: medians over measured steps; stock has none of them ("–").
    assert comparison.row(report.ROW_DEVICE_HIT).tencache == pytest.approx(0.9)
    assert comparison.row(report.ROW_DEVICE_HIT).cells(True)[1:] == ("–", "90.0 %", "–", "–")
    assert comparison.row(report.ROW_FETCH_WAIT).tencache == pytest.approx(0.5)
    assert comparison.row(report.ROW_FETCH_SHARE).tencache == pytest.approx(25.0)  # 0.5 s of a 2 s step
    assert comparison.row(report.ROW_NVME_READ).tencache == GB
    # tencache's own counters: per step in schema rows, not a running total
    assert comparison.row("NVMe read bytes/step (tencache's own counters, median)").tencache == GB
    # the plugin's pinned memory from its metrics; stock's estimate from its stats
    assert (comparison.row(report.ROW_PINNED).stock, comparison.row(report.ROW_PINNED).tencache) == (2 << 30, 1 << 20)


def test_drive_wear_per_arm_at_its_measured_rate():
    """Scenario: stock writes 4 GB a 3 s step, tencache 0.5 GB a 2 s step, stock CPU offload nothing. The bench says
    what a day of training writes, and with a rating how many days the drive lasts (never: nothing written)."""
    # Step 1: no rating: bytes per day (a full-table row and a note); no days row.
    comparison = compare(three_arms(), warmup_steps=1)
    per_day = comparison.row(report.ROW_WRITTEN_PER_DAY)
    assert (per_day.stock, per_day.tencache, per_day.stock_cpu) == (4 * GB * 28800, GB // 2 * 43200, 0)
    assert per_day.cells()[1:3] == ("115 TB", "21.60 TB")  # as drive ratings are given (was 104.77 TiB, 19.65 TiB)
    assert not [row for row in comparison.details if row.name == report.ROW_DAYS_TO_TBW]
    wear = next(note for note in comparison.notes if note.startswith("drive wear"))
    assert "stock 115 TB, tencache 21.60 TB, stock-cpu 0 TB" in wear and "--drive-tbw" in wear
    # Step 2: a 600 TB rating: 600e12 / 115.2e12 = 5.2 days for stock, 27.8 for tencache, never for stock-cpu.
    rated = compare(three_arms(), warmup_steps=1, drive_tbw_bytes=600e12)
    days = rated.row(report.ROW_DAYS_TO_TBW)
    assert (days.stock, days.tencache, days.stock_cpu) == ("5.2", "27.8", "never")
    assert "days to the drive's rated 600 TB with 1 rank(s) writing to it: stock 5.2, tencache 27.8, " \
        "stock-cpu never" in next(note for note in rated.notes if note.startswith("drive wear"))
    # Step 3: two ranks writing to the one drive (bench --ranks 2) wear it twice as fast.
    shared = compare(three_arms(), warmup_steps=1, drive_tbw_bytes=600e12, ranks_per_drive=2)
    assert shared.row(report.ROW_DAYS_TO_TBW).stock == "2.6"
    # ... and the headline's per-rank figures say whose they are (until 2026-12-02 only the wear note did)
    assert any(note.startswith("2 ranks: memory, NVMe bytes and tencache's figures are rank 0's") for note in
               shared.notes) and not any(note.startswith("1 ranks") for note in rated.notes)


def test_stock_cpu_column():
    """Scenario: --compare cpu adds a stock-cpu column to every table, with that arm's own values."""
    comparison = compare(three_arms(), warmup_steps=1)
    assert comparison.has_stock_cpu and comparison.num_measured_steps == {"stock": 3, "tencache": 3, "stock-cpu": 3}
    header = report.render_table(comparison).splitlines()[0].split()
    assert header == ["metric", "stock", "tencache", "tencache/stock", "stock-cpu"]
    assert comparison.row(report.ROW_STEP_TIME).cells(True) == ("step time (s, median)", "3.000", "2.000", "0.667",
                                                                "1.500")
    assert comparison.row(report.ROW_NVME_READ).stock_cpu == 0
    markdown = report.render_markdown(comparison, "x", {})
    assert "| metric | stock | tencache | tencache/stock | stock-cpu |" in markdown
    assert "| step time (s, median) | 3.000 | 2.000 | 0.667 | 1.500 |" in markdown
    # Without the third arm there is no such column.
    two = compare(three_arms()[:2], warmup_steps=1)
    assert not two.has_stock_cpu and "stock-cpu" not in report.render_table(two)
    assert len(two.row(report.ROW_STEP_TIME).cells(two.has_stock_cpu)) == 4


def test_bound_is_the_slower_of_compute_and_nvme(tmp_path):
    """Scenario: tencache reads 1 GB and writes 0.5 GB per step, the least its (empty) budgets allow; its step
    takes 2 s."""
    # Step 1: the arithmetic: 1 GB / 1 GB/s + 0.5 GB / 0.5 GB/s = 2 s of NVMe per step.
    bandwidth = report.NvmeBandwidth(read_bytes_per_s=GB, write_bytes_per_s=GB / 2, source="test")
    assert report.compute_bound(GB, GB / 2, bandwidth, None).io_s == pytest.approx(2.0)
    assert report.compute_bound(GB, GB / 2, None, 1.25).seconds == 1.25  # no bandwidth: compute only
    assert report.compute_bound(GB, GB / 2, None, None).seconds is None
    assert report.compute_bound(0, 0, bandwidth, None).seconds is None  # nothing moved, compute unknown: no bound
    # The drive's combined rate (reads and writes at once) shortens it: 1.5 GB at 1 GB/s together, reads alone
    # 1 s, writes alone 1 s: 1.5 s.
    combined = report.NvmeBandwidth(GB, GB / 2, "test", combined_bytes_per_s=GB)
    assert report.compute_bound(GB, GB / 2, combined, None).io_s == pytest.approx(1.5)
    # Two ranks swap under one --nvme-path: the drive moves both ranks' bytes (rank 0's profile gives one rank's).
    # Until 2026-12-02 the bound of a `bench --ranks 2` priced one rank's bytes at the whole drive's rate.
    two_ranks = report.compute_bound(GB, GB / 2, combined, None, ranks_per_drive=2)
    assert two_ranks.io_s == pytest.approx(3.0) and "x 2 ranks on the drive" in two_ranks.describe()
    # Step 2: NVMe-limited: 2 s of I/O beats the 1.5 s stock CPU offload step; step time / bound = 2 / 2.
    comparison = compare(three_arms(profile_dir=tmp_path), warmup_steps=1, nvme_bandwidth=bandwidth)
    assert comparison.bound.seconds == pytest.approx(2.0) and comparison.bound.limited_by == "NVMe"
    assert comparison.row(report.ROW_BOUND).tencache == pytest.approx(2.0)
    assert comparison.row(report.ROW_VS_BOUND).tencache == pytest.approx(1.0)
    assert comparison.row(report.ROW_VS_BOUND).cells()[1:3] == ("–", "1.00×")
    # Step 3: compute-limited: a faster drive (4 GB/s both ways: 0.375 s) leaves the 1.5 s CPU-offload step.
    fast = compare(three_arms(profile_dir=tmp_path), warmup_steps=1,
                   nvme_bandwidth=report.NvmeBandwidth(4 * GB, 4 * GB, "given"))
    assert fast.bound.seconds == pytest.approx(1.5) and fast.bound.limited_by == "compute"
    assert fast.row(report.ROW_VS_BOUND).tencache == pytest.approx(2.0 / 1.5)
    # Step 4: it reaches bench.json with its parts, and the terminal explains it.
    bound = json.loads(json.dumps(fast.to_dict()))["bound"]
    assert bound["io_s"] == pytest.approx(0.375) and bound["compute_s"] == 1.5
    assert bound["bandwidth"]["read_bytes_per_s"] == 4 * GB
    assert "bound (s): 1.500 s, limited by compute" in report.render_table(fast)
    # Step 5: no stock CPU offload arm: compute is tencache's own step less its NVMe wait (2 s - 0.5 s).
    two = compare(three_arms()[:2], warmup_steps=1)
    assert two.bound.seconds == pytest.approx(1.5)
    assert "tencache's step less its NVMe wait" in two.row(report.ROW_BOUND).note
    # Without a profile there are no least bytes, and the bound is compute alone (never tencache's own bytes,
    # which are no lower bound).
    no_profile = compare(three_arms(), warmup_steps=1, nvme_bandwidth=bandwidth)
    assert no_profile.bound.io_s is None and no_profile.bound.seconds == pytest.approx(1.5)
    assert "no least bytes per step: the run saved no profile" in no_profile.row(report.ROW_BOUND).note
    # Step 6: a stock CPU offload step slower than tencache's (it gathers every micro-batch, tencache once a step)
    # is no bound: the smaller compute wins, so no step is ever measured below its bound.
    slow_cpu = compare(three_arms(stock_cpu_times=(9.0, 3.0, 3.0, 3.0), profile_dir=tmp_path), warmup_steps=1,
                       nvme_bandwidth=report.NvmeBandwidth(4 * GB, 4 * GB, "given"))
    assert slow_cpu.bound.compute_s == pytest.approx(1.5) and slow_cpu.row(report.ROW_VS_BOUND).tencache >= 1
    # Step 7: a slow measured bandwidth (0.5 GB/s: 3 s of NVMe) puts the bound above tencache's 2 s step: no ratio
    # below 1 is reported against it, and the note says why.
    understated = compare(three_arms(profile_dir=tmp_path), warmup_steps=1,
                          nvme_bandwidth=report.NvmeBandwidth(GB / 2, GB, "test"))
    row = understated.row(report.ROW_VS_BOUND)
    assert row.tencache is None and "the bound is wrong" in row.note and "faster than measured" in row.note
    # Step 8: neither part (no timings, no bandwidth): no bound, and the table says "–" rather than inventing one.
    assert report.least_compute([], []) == (None, "")
    # A wait above the step (clocks of two threads) gives no compute figure below 0 that would hide stock CPU
    # offload's step: the bound then takes that step.
    assert report.least_compute([1.5], [(1.0, 2.0)]) == (1.5, "the stock-cpu step (fastest measured)")
    assert report.least_compute([None], [(1.0, 2.0)]) == (None, "")
    none = report.compute_bound(GB, GB, None, None)
    assert none.seconds is None and "no bound" in none.describe() and "--compare cpu" in none.describe()


def test_no_measured_step_is_below_the_bound_whose_compute_is_the_fastest_step_less_its_own_wait(tmp_path):
    """Regression test (helper-205's review): the compute part was the median step less the median wait, and only
    the median step was held against the bound: about half of the measured steps came out below it, and where the
    wait was 0 "step time / bound" was 1.00x by construction. The compute part is now the fastest measured step
    less its own wait, and every measured step is held against the bound."""
    runs = [BenchRun("stock", 1, make_result([9.0, 3.0, 3.0, 3.0], io_read=[0] * 4, io_write=[0] * 4)),
            BenchRun("tencache", 1, make_result([9.0, 2.0, 1.6, 2.4], io_read=[0] * 4, io_write=[0] * 4),
                     schema_rows(4, fetch_wait=(0.0, 0.0, 0.2, 0.0)))]
    comparison = compare(runs, warmup_steps=1)
    # the steps after warm-up: 2.0 (wait 0), 1.6 (wait 0.2), 2.4 (wait 0): the least is 1.6 - 0.2
    assert comparison.bound.compute_s == pytest.approx(1.4) and comparison.bound.limited_by == "compute"
    assert "fastest measured" in comparison.row(report.ROW_BOUND).note
    assert comparison.row(report.ROW_VS_BOUND).tencache == pytest.approx(2.0 / 1.4)
    # a bound above one measured step gives no ratio, though the median step is above it: 1 GB read and 0.5 GB
    # written at 1 GB/s, 1.5 s, against steps of 2.0, 1.4 and 2.4 s
    varied = compare(three_arms(profile_dir=tmp_path, tencache_times=(9.0, 2.0, 1.4, 2.4)), warmup_steps=1,
                     nvme_bandwidth=report.NvmeBandwidth(GB, GB, "test"))
    assert varied.bound.seconds == pytest.approx(1.5) and varied.bound.limited_by == "NVMe"
    row = varied.row(report.ROW_VS_BOUND)
    assert row.tencache is None and "a measured step (1.400 s) is below the bound" in row.note, row
    assert report.least_compute([1.5, 1.2], [(2.0, 0.1), (1.9, 0.8)]) == (
        pytest.approx(1.1), "tencache's step less its NVMe wait (fastest measured)")


def test_old_metrics_files_still_give_per_step_nvme_bytes():
    """Regression guard: metrics rows from before schema "tencache.metrics/1" hold running totals under
    nvme_*_bytes and the step's part as nvme_*_bytes_per_step; the headline must not take the totals."""
    old_rows = tuple({"step": step, "nvme_read_bytes": 100 * (step + 1), "nvme_read_bytes_per_step": 100,
                      "nvme_write_bytes": 7, "nvme_write_bytes_per_step": 7 if step == 0 else 0}
                     for step in range(4))
    runs = [BenchRun("stock", 1, make_result([1.0] * 4)), BenchRun("tencache", 1, make_result([1.0] * 4), old_rows)]
    comparison = compare(runs, warmup_steps=1)
    assert comparison.row("NVMe read bytes/step (tencache's own counters, median)").tencache == 100
    assert comparison.row("NVMe write bytes/step (tencache's own counters, median)").tencache == 0
    assert comparison.row(report.ROW_DEVICE_HIT).tencache is None  # an old file has no hit rates: "–"
    assert not any("nvme_read_bytes_per_step" in row.name for row in comparison.details)  # the headline has it


# ----------------------------------------------------------------------------------------------------------------
# The figure
# ----------------------------------------------------------------------------------------------------------------
def test_dashboard_leaves_out_constant_series_and_empty_panels():
    """Scenario: pinned memory and the host hit rate never change; stock has no hit rates at all."""
    # Step 1: tencache's pinned memory is 1 MiB at every step, stock's 2 GiB at every step; the host hit rate is
    # always 100 %, the device hit rate varies.
    runs = three_arms()
    runs[1] = dataclasses.replace(runs[1], metrics_rows=schema_rows(4, read=(GB, 2 * GB), device_hit=(0.5, 0.8)))
    plan = dashboard.plan_dashboard(runs)
    drawn = {planned.panel.title: [series.key for series in planned.drawn] for planned in plan.panels}
    # Step 2: the constant series are not drawn, and their values are named, per arm.
    assert report.PINNED not in drawn["host memory"] and report.PEAK_RSS in drawn["host memory"]
    # (the fetch wait is 0.1 s per step, but its share of the 9 s warm-up step differs, so it is drawn)
    assert drawn["hit rates and fetch wait"] == [report.DEVICE_HIT, dashboard.FETCH_SHARE]
    # stock-cpu has no pinned value at all, so the text does not name it
    assert "host memory, pinned: stock 2.00 GiB, tencache 1.00 MiB" in plan.constants
    assert "hit rates and fetch wait, host hit rate: tencache 100.0 %" in plan.constants
    # Step 3: a panel with nothing to draw is left out: runs without plugin metrics have no hit rates.
    stock_only = [runs[0], dataclasses.replace(runs[0], arm="tencache")]
    titles = [planned.panel.title for planned in dashboard.plan_dashboard(stock_only).panels]
    assert "hit rates and fetch wait" not in titles and "step time per step" in titles


def test_dashboard_png_is_one_file(tmp_path):
    pytest.importorskip("matplotlib")
    runs = three_arms()
    plan = dashboard.plan_dashboard(runs)
    assert dashboard.write_dashboard(plan, runs, str(tmp_path / "dashboard.png"), warmup_steps=1, title="t")
    assert [path.name for path in tmp_path.iterdir()] == ["dashboard.png"]
    assert (tmp_path / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # nothing to draw: no file
    assert not dashboard.write_dashboard(dashboard.DashboardPlan((), ()), runs, str(tmp_path / "none.png"), 1)
    assert not (tmp_path / "none.png").exists()


def test_the_stage3_knobs_of_each_arm_are_stated():
    """A comparison with stock CPU offload is fair only with DeepSpeed's default knobs; the report says which each
    arm ran with."""
    nvme = {"zero_optimization": {"stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 0}}
    runs = [BenchRun("stock", 1, make_result([1.0] * 3, ds_config=nvme)),
            BenchRun("tencache", 1, make_result([1.0] * 3, ds_config=nvme)),
            BenchRun("stock-cpu", 1, make_result([1.0] * 3, ds_config={"zero_optimization": {"stage": 3}}))]
    note = next(note for note in compare(runs, warmup_steps=1).notes if note.startswith("stage-3 fetch knobs"))
    assert "stock: max_reuse_distance=0, param_persistence_threshold=0 (the rest DeepSpeed's defaults)" in note
    assert note.endswith("stock-cpu: DeepSpeed's defaults")


def test_a_stock_arm_that_crashed_leaves_tencache_compared_with_stock_cpu_offload():
    """Stock NVMe crashes where tencache trains (e.g. DeepSpeed's default reuse distance: "Not enough buffers 0
    for swapping 1"); with a stock CPU offload arm the bench still reports, and says what stock died of."""
    runs = [BenchRun("tencache", 1, make_result([9.0, 2.0, 2.0, 2.0])),
            BenchRun("stock-cpu", 1, make_result([9.0, 2.5, 2.5, 2.5]))]
    with pytest.raises(ValueError, match="no stock run"):
        compare(runs, warmup_steps=1)
    comparison = compare(runs, warmup_steps=1, stock_crashed="stock-1 exited 1: AssertionError: Not enough buffers")
    step = comparison.row(report.ROW_STEP_TIME)
    assert (step.stock, step.tencache, step.ratio, step.stock_cpu) == (None, 2.0, None, 2.5)
    assert comparison.notes[0] == "step time tencache / stock-cpu: 0.800"
    assert comparison.notes[1].startswith("stock NVMe crashed, so its column is empty: stock-1 exited 1")
    assert comparison.losses_identical
    # a repeat crashed after one had finished: its column holds that run, and the note no longer says it is empty
    runs.append(BenchRun("stock", 1, make_result([9.0, 3.0, 3.0, 3.0])))
    comparison = compare(runs, warmup_steps=1, stock_crashed="stock-2 exited 1: AssertionError: Not enough buffers")
    assert comparison.row(report.ROW_STEP_TIME).stock == 3.0
    assert comparison.notes[1].startswith("stock NVMe crashed, so its column is from 1 finished run(s): stock-2")


def test_bytes_over_least_bytes_is_never_below_1(tmp_path):
    """Scenario: tencache's profile and budgets say what must move; the headline divides what moved by it."""
    # Step 1: an empty parameter budget: the least is 1 GB read + 0.5 GB written, and the run moved exactly that.
    exact = compare(three_arms(profile_dir=tmp_path), warmup_steps=1)
    row = exact.row(report.ROW_VS_LEAST)
    assert row.tencache == pytest.approx(1.0) and row.cells()[2] == "1.00×"
    assert "tencache-1.profile.json" in row.note and "params 0 B" in row.note
    least = exact.row("least NVMe bytes/step, params")
    assert least.tencache == 1.5 * GB
    # Step 2: a budget that holds the parameter: nothing has to move, yet 1.5 GB did: no ratio, and the note says so.
    held = compare(three_arms(profile_dir=tmp_path, param_budget=GB), warmup_steps=1)
    assert held.row(report.ROW_VS_LEAST).tencache is None
    assert "where the budgets hold every tensor" in held.row(report.ROW_VS_LEAST).note
    # Step 2b: a store that keeps no copy between uses (streaming), with slots too few for every partition of the
    # step (a quarter of the 0.5 GB one): they are no room to keep it in, so the least is every byte, as in step 1
    # (counted as room, the least came out below what any such run moves).
    streaming = compare(three_arms(profile_dir=tmp_path, param_budget=GB // 8, param_keeps_copies=0), warmup_steps=1)
    assert streaming.row(report.ROW_VS_LEAST).tencache == pytest.approx(1.0)
    assert "params 0 B" in streaming.row(report.ROW_VS_LEAST).note
    caching = compare(three_arms(profile_dir=tmp_path, param_budget=GB // 8, param_keeps_copies=1), warmup_steps=1)
    assert caching.row(report.ROW_VS_LEAST).tencache > 1.0  # a caching store's slots may keep part of it
    # Step 2c: streaming slots that take every partition: at one rank on a host accelerator the device tier holds
    # them lent from use to use (param_swapper.host_param_capacity), so they count, as in step 2.
    whole = compare(three_arms(profile_dir=tmp_path, param_budget=GB, param_keeps_copies=0), warmup_steps=1)
    assert whole.row(report.ROW_VS_LEAST).tencache is None
    assert "where the budgets hold every tensor" in whole.row(report.ROW_VS_LEAST).note
    # Step 3: a least above what moved is a wrong least: no ratio below 1, and the note says why.
    runs = three_arms(profile_dir=tmp_path)
    save_section(runs[1].result["ds_config"]["tencache"]["profile_path"], "params", "f" * 16,
                 StepProfile.untimed(["a", "a"], [GB, GB]))  # twice the bytes the run moved
    wrong = compare(runs, warmup_steps=1).row(report.ROW_VS_LEAST)
    assert wrong.tencache is None and "so the least is wrong" in wrong.note
    # Step 4: no profile: no ratio, and why.
    assert "the run saved no profile" in compare(three_arms(), warmup_steps=1).row(report.ROW_VS_LEAST).note
    # Step 5: an "auto" budget that was larger in the warm-up step (grown, then given back) bounds nothing the
    # measured steps did: the least is for the budgets they ran with (1.00x), not "the budgets hold every tensor".
    runs = three_arms(profile_dir=tmp_path)
    runs[1].result["steps"][0]["stats"]["param_reserved_bytes"] = GB
    assert compare(runs, warmup_steps=1).row(report.ROW_VS_LEAST).tencache == pytest.approx(1.0)


@pytest.mark.parametrize("filled, from_files, least_read, least_write",
                         [(0, 0, 6, 6), (1, 0, 5, 5), (2, 0, 4, 4), (2, 2, 6, 4), (2, 1, 5, 4)])
def test_masters_filled_from_the_partitions_are_no_bytes_the_least_bytes_owe_the_drive(tmp_path, filled, from_files,
                                                                                       least_read, least_write):
    """Scenario: two sub-groups streamed through an empty optimizer budget (each master and two moments read and
    written every step, 1 GB each). A run that filled masters from the parameter partitions (its stats count them
    and their bytes) owes the drive neither the read nor the write of those (the partitions hold what the update
    leaves: integrations/deepspeed/master_write_behind.py): with one of the two filled each step the least is the
    other's read and write and the moments' (the most bytes a step filled, less, each way: 6 - 1 GB), with both,
    the moments' alone. A master filled from partitions on file (``from_files`` a step) was read all the same, from
    their files: only its write is saved (with both so filled the least read is all 6 GB; counted as no read, the
    least on gpt2-2.7b came out 10.4 GB a step below what the run had to read)."""
    path = str(tmp_path / "tencache-1.profile.json")
    keys = [f"{state}{group}.tensor.swp" for group in ("0_4", "5_9") for state in ("", "exp_avg-", "exp_avg_sq-")]
    save_section(path, "optimizer", "f" * 16, StepProfile.untimed(keys, [GB] * 6))
    stats = [{"optimizer_cache_budget_bytes": 0, "optimizer_masters_from_partitions": filled * step,
              "optimizer_cache_copied_bytes": filled * step * GB,
              "optimizer_master_bytes_read_from_partition_files": from_files * step * GB} for step in range(4)]
    run = BenchRun("tencache", 1, make_result([2.0] * 4, stats=stats, io_read=[GB] * 4, io_write=[GB] * 4,
                                              ds_config={"tencache": {"enabled": True, "profile_path": path}}))
    least, _source = report.run_least_bytes(run, warmup_steps=1)
    assert (least["optimizer"].read_bytes, least["optimizer"].write_bytes) == (least_read * GB, least_write * GB)
    assert least["optimizer"].total_bytes == (least_read + least_write) * GB


def test_the_smallest_least_of_the_repeats_is_chosen_by_the_figure_the_ratio_divides_by(monkeypatch):
    """Regression test (helper-205's review): repeats with other "auto" budgets have other least bytes; the smallest
    was chosen by total_bytes, while the ratio divides by the larger of total and read + written: a least of 12
    was taken over one of 11."""
    from tencache_ds.plan.least_bytes import LeastBytes
    leasts = {"a": LeastBytes(6, 6, 10, 20, 20, 0), "b": LeastBytes(6, 5, 11, 20, 20, 0)}
    monkeypatch.setattr(report, "run_least_bytes",
                        lambda run, warmup_steps: ({"optimizer": leasts[run.label]}, f"run {run.label}"))
    runs = [types.SimpleNamespace(label="a"), types.SimpleNamespace(label="b")]
    total, stores, source = report.least_bytes_of(runs)
    assert source == "run b" and report.least_total(total) == 11


def test_each_repeat_is_set_over_its_own_least_bytes(monkeypatch):
    """Regression test (helper-226's review): repeats whose "auto" budgets came out differently have other least
    bytes; the median moved over all repeats was set over the smallest least (the largest budget's), so two runs
    that each moved exactly their own least showed more than 1.00x. Each run's bytes go over its own least now."""
    from tencache_ds.plan.least_bytes import LeastBytes
    first = three_arms()  # 1 GB read + 0.5 GB written a step
    second = BenchRun("tencache", 2, make_result([2.0] * 4, stats=[{}] * 4, io_read=[GB // 2] * 4, io_write=[0] * 4),
                      schema_rows(4, read=(GB // 2,), write=(0,), fetch_wait=(0.5,)))  # 0.5 GB read a step
    leasts = {first[1].label: LeastBytes(GB, GB // 2, 3 * GB // 2, 0, 0, 0),  # each moved its own least
              second.label: LeastBytes(GB // 2, 0, GB // 2, 0, 0, 0)}
    monkeypatch.setattr(report, "run_least_bytes",
                        lambda run, warmup_steps: ({"params": leasts[run.label]}, f"run {run.label}"))
    row = compare([first[0], first[1], second, first[2]], warmup_steps=1).row(report.ROW_VS_LEAST)
    assert row.tencache == pytest.approx(1.0), row.note  # 2.0x before: the median 1 GB over the smaller least
    assert "the median of 2 runs' own ratios (1.00, 1.00)" in row.note


@pytest.mark.parametrize("stats, says", [({"tencache_enabled": 0}, "tencache-1 did not run tencache (step 0"),
                                         ({"stats_error": "RuntimeError: no"}, "tencache_ds.stats failed at step 0")])
def test_a_tencache_run_that_ran_stock_is_refused_not_compared(stats, says):
    """helper-241: a training script (TENCACHE_BENCH_TRAIN_SCRIPT) that never imported tencache_ds or dropped the
    block ran stock in the tencache arm, and the bench printed its numbers as tencache's, with ratios."""
    runs = [BenchRun("stock", 1, make_result([1.0, 1.0, 1.0])),
            BenchRun("tencache", 1, make_result([1.0, 1.0, 1.0], stats=[dict(stats)] * 3))]
    with pytest.raises(ValueError, match=re.escape(says)):
        report.compare(runs, warmup_steps=1)
    runs[1].result["steps"] = make_result([1.0, 1.0, 1.0], stats=[{"tencache_enabled": 1}] * 3)["steps"]
    assert report.compare(runs, warmup_steps=1)
