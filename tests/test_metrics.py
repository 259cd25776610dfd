"""The per-step metrics schema: its key set (what users' dashboards read), deltas of running totals, rates."""
import json

import pytest

from tencache_ds.metrics import SCHEMA, Gauges, MetricsWriter, RunningTotals, StepMeter

SCHEMA_KEYS = {"schema", "step", "step_time_s", "fetch_wait_s", "device_hit_rate", "host_hit_rate",
               "nvme_read_bytes", "nvme_write_bytes", "prefetch_issued", "prefetch_late", "pinned_bytes_reserved",
               "pinned_bytes_in_use", "host_cache_bytes_in_use", "device_cache_bytes_in_use",
               "host_cache_budget_bytes", "host_memory_available_bytes", "host_step_rise_bytes",  # 2: memory pressure
               "param_nvme_wait_s", "optimizer_nvme_wait_s", "device_fetch_s", "device_fetch_bytes",  # 3: honest device
               "nvme_busy_fraction", "nvme_queue_depth",  # 4: how busy the drive was kept
               "device_cache_peak_bytes",  # 5: what the device tier held during the step
               "device_gathers",  # 6: how many gathers moved the device's bytes
               "nvme_write_bytes_per_day"}  # 7: what the run costs the drive


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_key_set_is_the_schema():
    meter = StepMeter(clock=Clock())
    assert set(meter.step_end(RunningTotals(), Gauges()).flat()) == SCHEMA_KEYS
    assert SCHEMA == "tencache.metrics/9"


def test_steps_report_increases_since_the_previous_step():
    clock = Clock()
    meter = StepMeter(clock=clock, start=RunningTotals(nvme_read_bytes=1000, host_hits=5))
    clock.now += 2.0
    first = meter.step_end(RunningTotals(nvme_read_bytes=1500, nvme_write_bytes=2000, host_hits=8,
                                         host_misses=1, device_fetches=10, device_hits=9, param_nvme_wait_s=0.375,
                                         optimizer_nvme_wait_s=0.125,
                                         prefetch_issued=4, prefetch_late=1, device_fetch_bytes=4096,
                                         device_gathers=3, device_fetch_s=0.25),
                           Gauges(pinned_bytes_reserved=64, device_cache_bytes_in_use=32))
    assert (first.step, first.step_time_s, first.nvme_read_bytes, first.fetch_wait_s) == (0, 2.0, 500, 0.5)
    assert first.nvme_write_bytes_per_day == 2000 * 86400 / 2.0  # the rate this step wears the drive at
    assert (first.param_nvme_wait_s, first.optimizer_nvme_wait_s) == (0.375, 0.125)
    assert (first.device_fetch_bytes, first.device_gathers, first.device_fetch_s) == (4096, 3, 0.25)
    assert first.host_hit_rate == 3 / 4 and first.device_hit_rate == 0.9
    assert (first.prefetch_issued, first.prefetch_late) == (4, 1)
    assert (first.pinned_bytes_reserved, first.device_cache_bytes_in_use) == (64, 32)
    clock.now += 1.0
    second = meter.step_end(RunningTotals(nvme_read_bytes=1500, nvme_write_bytes=2000, host_hits=8,
                                          host_misses=1, device_fetches=10, device_hits=9, param_nvme_wait_s=0.375,
                                          optimizer_nvme_wait_s=0.125,
                                          prefetch_issued=4, prefetch_late=1, device_fetch_bytes=4096,
                                          device_gathers=3, device_fetch_s=0.25),
                            Gauges())
    assert (second.step, second.step_time_s, second.nvme_read_bytes, second.fetch_wait_s) == (1, 1.0, 0, 0.0)
    assert second.nvme_write_bytes_per_day == 0
    assert second.host_hit_rate is None and second.device_hit_rate is None  # no accesses: no rate, not 0
    assert second.device_fetch_bytes is None and second.device_gathers is None  # no use: nothing to say
    assert second.device_fetch_s is None  # nothing timed (helper-218: 0.0 claimed the gathers took no time)
    assert meter.latest is second


def test_device_numbers_are_not_applicable_where_a_gather_is_the_partition():
    """One rank on DeepSpeed's CPU accelerator: a gathered parameter is a view of its partition, so a kept one saves
    no bytes; a 100% hit rate there would claim what did not happen."""
    meter = StepMeter(clock=Clock())
    step = meter.step_end(RunningTotals(device_fetches=10, device_hits=10, device_gathers=2, device_fetch_s=0.1),
                          Gauges(), device_tier_applies=False)
    assert step.device_hit_rate is None and step.device_fetch_bytes is None and step.device_gathers is None
    assert step.device_fetch_s == 0.1  # time spent in DeepSpeed's fetch path is real either way


def test_writer_appends_one_json_line_per_step(tmp_path):
    path = tmp_path / "runs" / "metrics.jsonl"
    writer = MetricsWriter(str(path))
    meter = StepMeter(clock=Clock())
    for _ in range(3):
        writer.write(meter.step_end(RunningTotals(), Gauges()))
    writer.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert all(set(line) == SCHEMA_KEYS for line in lines)


def test_busy_fraction_and_queue_depth_come_from_the_drive_activity_of_the_step():
    """A 2 s step with the drive busy 1.5 s of it, 3 depth-seconds meanwhile (two requests at once half the time):
    busy 75%, queue depth 2. A step with no request: busy 0 and no depth (not 0: nothing was queued)."""
    clock = Clock()
    meter = StepMeter(clock=clock, start=RunningTotals(nvme_busy_s=10.0, nvme_depth_s=20.0))
    clock.now += 2.0
    step = meter.step_end(RunningTotals(nvme_busy_s=11.5, nvme_depth_s=23.0), Gauges())
    assert (step.nvme_busy_fraction, step.nvme_queue_depth) == (0.75, 2.0)
    clock.now += 1.0
    idle = meter.step_end(RunningTotals(nvme_busy_s=11.5, nvme_depth_s=23.0), Gauges())
    assert (idle.nvme_busy_fraction, idle.nvme_queue_depth) == (0.0, None)


def test_a_step_skipped_on_an_overflow_keeps_its_number():
    """Stage 3 returns from a step skipped on an overflow before its _post_step: no record, but the engine counts the
    step, and a resumed run numbers its records from the engine's global step (``restart``). Until 2026-12-07 the
    records were numbered by the steps that ran: after a skip, record k was not step k, and a resume jumped."""
    meter = StepMeter(clock=Clock())
    ran = meter.optimizer_step(lambda: meter.step_end(RunningTotals(), Gauges()))
    assert ran.step == 0
    assert meter.optimizer_step(lambda: "skipped") == "skipped"  # no step_end: an overflow
    assert meter.optimizer_step(lambda: meter.step_end(RunningTotals(), Gauges())).step == 2
    with pytest.raises(ZeroDivisionError):  # a step that raised is no step the engine counted, its error not kept
        meter.optimizer_step(lambda: 1 / 0)
    assert meter.optimizer_step(lambda: meter.step_end(RunningTotals(), Gauges())).step == 3
