"""tencache_ds/bench/report.py on hand-made result dicts (the scripts/train.py result contract): medians leave out
warm-up steps, ratios, loss/weight equality, generic stats and metrics rows, rendering and plots. No DeepSpeed."""
import json

import pytest

from tencache_ds.bench import report
from tencache_ds.bench.report import BenchRun, compare


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
    row = comparison.row("median step time (s)")
    assert row.stock == 2.0 and row.tencache == 1.0
    # Step 3: the ratio is tencache / stock.
    assert row.ratio == pytest.approx(0.5)
    assert comparison.num_measured_steps == {"stock": 3, "tencache": 3}
    # Step 4: with no warm-up the slow steps do count.
    assert compare([stock, tencache], warmup_steps=0).row("median step time (s)").stock == 3.0


def test_repeats_are_pooled_per_arm():
    """Scenario: two repeats of each arm; the median is over all measured steps of the arm's repeats."""
    runs = [BenchRun("stock", 1, make_result([9.0, 1.0, 1.0])), BenchRun("tencache", 1, make_result([9.0, 4.0, 4.0])),
            BenchRun("stock", 2, make_result([9.0, 3.0, 3.0])), BenchRun("tencache", 2, make_result([9.0, 6.0, 6.0]))]
    row = compare(runs, warmup_steps=1).row("median step time (s)")
    # stock pooled [1, 1, 3, 3] -> 2; tencache pooled [4, 4, 6, 6] -> 5
    assert (row.stock, row.tencache) == (2.0, 5.0)
    assert row.ratio == pytest.approx(2.5)


def test_ratio_math():
    assert report.ratio(4, 2) == pytest.approx(0.5)
    assert report.ratio(2, 4) == pytest.approx(2.0)
    assert report.ratio(0, 4) is None          # no ratio to a zero
    assert report.ratio(None, 4) is None
    assert report.ratio(4, "native") is None
    assert report.format_ratio(0.5) == "0.500" and report.format_ratio(None) == "—"


def test_identical_loss_bits_and_weights_are_detected():
    """Scenario: both arms produce the same loss bits and weights."""
    runs = [BenchRun("stock", 1, make_result([1.0] * 4)), BenchRun("tencache", 1, make_result([1.0] * 4))]
    comparison = compare(runs, warmup_steps=1)
    assert comparison.losses_identical and comparison.weights_identical
    assert comparison.row("losses identical (all steps, loss_bits)").verdict == "yes"
    assert comparison.row("final weights identical (sha256)").verdict == "yes"


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
    assert comparison.row("losses identical (all steps, loss_bits)").verdict == "NO"
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
    assert comparison.row("stats.brand_new_counter (after last step)").tencache == 2
    fancy = comparison.row("stats.fancy_cache_bytes (after last step)")
    assert fancy.tencache == 3072 and fancy.cells()[2] == "3.00 KiB" and fancy.cells()[1] == "n/a"
    assert comparison.row("stats.arena_backend (after last step)").tencache == "native"
    # Step 3: a metrics-only key has a median-per-step row (steps 1, 2 -> 10, 20 -> 15); keys the stats already
    # show and wall-clock stamps do not get a second row.
    assert comparison.row("metrics.prefetch_late_per_step (median/step)").tencache == 15
    assert "metrics.brand_new_counter (median/step)" not in names
    assert not any("time_unix" in name for name in names)
    # Step 4: the new keys reach the rendered table too.
    table = report.render_table(comparison)
    assert "stats.brand_new_counter" in table and "metrics.prefetch_late_per_step" in table


def test_nvme_bytes_per_step_from_cumulative_stats_else_proc_io():
    """Scenario: tencache reports NVMe counters as running totals; stock has no stats, so /proc/self/io is used."""
    # Step 1: totals 100, 300, 600, 1000 -> per step 100, 200, 300, 400; measured (warm-up 1) median 300.
    stats = [{"nvme_read_bytes": total, "nvme_write_bytes": 2 * total} for total in (100, 300, 600, 1000)]
    runs = [BenchRun("stock", 1, make_result([1.0] * 4, io_read=[5, 7, 9, 11], io_write=[1, 1, 1, 1])),
            BenchRun("tencache", 1, make_result([1.0] * 4, stats=stats))]
    comparison = compare(runs, warmup_steps=1)
    read = comparison.row("NVMe read bytes/step (median)")
    # Step 2: stock from /proc/self/io (median of 7, 9, 11), tencache from the stats deltas.
    assert (read.stock, read.tencache) == (9.0, 300.0)
    assert read.note == "stock: /proc/self/io; tencache: stats"
    assert comparison.row("NVMe write bytes/step (median)").tencache == 600.0
    # Step 3: the kernel's view is shown for both arms as well.
    assert comparison.row("process disk read bytes/step (/proc/self/io, median)").tencache == 1000.0


def test_per_step_deltas():
    assert report.per_step_deltas([10, 30, 60]) == [10, 20, 30]
    assert report.per_step_deltas([10, None, 60, 70]) == [10, None, None, 10]


def test_peaks_and_pinned_memory_cover_all_steps():
    stats = [{"pinned_bytes_reserved": value, "pinned_bytes_peak_in_use": value // 2} for value in (900, 100, 100)]
    runs = [BenchRun("stock", 1, make_result([1.0] * 3)), BenchRun("tencache", 1, make_result([1.0] * 3, stats=stats))]
    comparison = compare(runs, warmup_steps=2)
    assert comparison.row("pinned bytes reserved (stats, max)").tencache == 900
    assert comparison.row("pinned bytes reserved (stats, max)").stock is None
    assert comparison.row("peak RSS").stock == 102 << 20


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
                                      ["plots/step_time.png"], ["python train.py --label stock-1"])
    assert "```\ntencache-ds bench --steps 3\n```" in markdown
    assert "- **CPU**: Test CPU, 2 cores" in markdown
    assert "| median step time (s) | 1.000 | 2.000 | 2.000 |" in markdown
    assert "odd\\|key_bytes" in markdown  # a pipe in a key does not break the table
    assert "![step_time](plots/step_time.png)" in markdown
    assert comparison.row("engine start-up (s)").ratio == pytest.approx(1 / 3)
    decoded = json.loads(json.dumps(comparison.to_dict()))
    assert decoded["losses_identical"] is True
    assert {row["name"] for row in decoded["rows"]} >= {"median step time (s)", "peak RSS"}
    table = report.render_table(comparison)
    assert table.splitlines()[0].split() == ["metric", "stock", "tencache", "tencache/stock"]


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


def test_plots_are_written_as_png(tmp_path):
    """Scenario: the four fixed plots plus one per other numeric series, all real PNG files."""
    stats = [{"pinned_bytes_reserved": 1 << 20, "pinned_bytes_peak_in_use": 1 << 19, "nvme_read_bytes": 100 * step,
              "nvme_write_bytes": 50 * step, "cache_hits": step} for step in range(4)]
    metrics = tuple({"step": step, "prefetch_late_per_step": step} for step in range(4))
    runs = [BenchRun("stock", 1, make_result([1.0, 0.5, 0.5, 0.5])),
            BenchRun("tencache", 1, make_result([1.0, 0.4, 0.4, 0.4], stats=stats), metrics)]
    written = report.write_plots(runs, str(tmp_path), warmup_steps=1)
    names = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*.png"))
    assert names == sorted(["step_time.png", "peak_rss.png", "pinned_memory.png", "nvme_bytes.png",
                            "metrics/stats.cache_hits.png", "metrics/metrics.prefetch_late_per_step.png"])
    assert sorted(written) == sorted(str(tmp_path / name) for name in names)
    for path in tmp_path.rglob("*.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path


def test_plots_without_stats_skip_the_pinned_plot(tmp_path):
    runs = [BenchRun("stock", 1, make_result([1.0] * 3)), BenchRun("tencache", 1, make_result([1.0] * 3))]
    written = report.write_plots(runs, str(tmp_path), warmup_steps=1)
    assert sorted(p.rsplit("/", 1)[-1] for p in written) == ["nvme_bytes.png", "peak_rss.png", "step_time.png"]
