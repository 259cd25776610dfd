"""The stats headline's pinned memory (integrations/deepspeed/stats.py): tencache's parameter slots, optimizer
arena and device-to-host staging chunks, plus what torch's CUDA host allocator pinned (0 without CUDA); stock's
swap buffers likewise. Plain objects stand in for the swappers: the arithmetic is what is tested."""
import pytest
import torch

pytest.importorskip("deepspeed")
from tencache_ds.integrations.deepspeed.stats import combined_stats  # noqa: E402

MIB = 1 << 20


class Swapper:
    """What combined_stats asks of tencache's swappers: their stats, and stock's estimate."""

    def __init__(self, stats):
        self._stats = stats

    def stats(self):
        return self._stats

    def stock_pinned_bytes_estimate(self):
        return 0


def test_pinned_memory_adds_the_slots_the_optimizer_arena_and_the_staging_chunks():
    params = Swapper({"param_locked_bytes": 300 * MIB, "param_registered_bytes": 310 * MIB,
                      "param_reserved_bytes": 310 * MIB, "param_peak_in_use_bytes": 200 * MIB,
                      "param_staging_registered_bytes": 0})
    optimizer = Swapper({"optimizer_locked_bytes": 0, "optimizer_registered_bytes": 0,
                         "optimizer_cache_staging_registered_bytes": 32 * MIB})
    headline = combined_stats(params, optimizer)
    assert headline["torch_pinned_bytes"] == 0  # no CUDA here
    assert headline["pinned_bytes_reserved"] == 310 * MIB + 32 * MIB  # registration pins the whole region
    assert headline["pinned_bytes_peak_in_use"] == 200 * MIB + 32 * MIB  # the slots' peak, the chunks whole


def test_memory_in_use_counts_as_pinned_only_where_locked_and_host_memory_counts_every_live_buffer():
    """Regression (helper-184's review), a recorded step's numbers (gpt2-small streaming, CPU accelerator: nothing
    locked): ``pinned_bytes_in_use`` added the slots in use, locked or not (1.45 GiB, with 0 B pinned), and
    ``host_bytes_reserved`` left out the optimizer's live slots and counted the parameter slots given back."""
    from tencache_ds.integrations.deepspeed.stats import gauges

    params = Swapper({"param_reserved_bytes": 406298624, "param_retired_bytes": 8 * MIB, "param_locked_bytes": 0,
                      "param_in_use_bytes": 66060288, "param_fallback_bytes_in_use": MIB,
                      "param_pageable_bytes_in_use": 0})
    optimizer = Swapper({"optimizer_reserved_bytes": 3982098432, "optimizer_retired_bytes": 1991049216,
                         "optimizer_locked_bytes": 0, "optimizer_in_use_bytes": 1493286912,
                         "optimizer_pageable_bytes_in_use": 2 * MIB, "optimizer_fallback_bytes_in_use": 3 * MIB})
    headline = combined_stats(params, optimizer)
    assert headline["pinned_bytes_reserved"] == headline["pinned_bytes_peak_in_use"] == 0
    assert headline["host_bytes_reserved"] == (406298624 - 8 * MIB + MIB) + (3982098432 - 1991049216 + 5 * MIB)
    assert gauges(params, optimizer, None).pinned_bytes_in_use == 0
    # locked: every live parameter slot (those retired are not), so all of their bytes in use are pinned
    params.stats()["param_locked_bytes"] = 406298624 - 8 * MIB
    assert gauges(params, optimizer, None).pinned_bytes_in_use == 66060288
    params.stats()["param_locked_bytes"] = 32 * MIB  # part of them (best effort): at most what is locked
    assert gauges(params, optimizer, None).pinned_bytes_in_use == 32 * MIB


def test_stock_pinned_memory_is_its_swap_buffers():
    class StockParams:  # stock's AsyncPartitionedParameterSwapper keeps its pinned pool in ``buffers``
        buffers = torch.empty(4 * MIB, dtype=torch.uint8)

    headline = combined_stats(StockParams(), None)
    assert headline["tencache_enabled"] == 0
    assert headline["pinned_bytes_reserved"] == headline["pinned_bytes_peak_in_use"] == 4 * MIB
    assert headline["torch_pinned_bytes"] == 0


def test_the_last_steps_gauges_do_not_replace_what_is_read_now():
    """tencache_ds.stats(engine) adds the last step's record; where the record has a gauge the stats read now
    (pinned bytes), the one read now stays (after a load, an eval or a gather it differs: helper-173)."""
    from types import SimpleNamespace

    from tencache_ds.integrations.deepspeed.stats import METRICS_METER_ATTRIBUTE, engine_stats
    from tencache_ds.metrics import Gauges, RunningTotals, StepMeter

    optimizer = SimpleNamespace(optimizer_swapper=Swapper({"optimizer_locked_bytes": 0,
                                                           "optimizer_registered_bytes": 0,
                                                           "optimizer_cache_staging_registered_bytes": 32 * MIB,
                                                           "host_cache_budget_bytes": 9}))  # (a start-up budget)
    meter = StepMeter()
    meter.step_end(RunningTotals(), Gauges(pinned_bytes_reserved=1, host_cache_bytes_in_use=7,
                                           host_cache_budget_bytes=5))
    setattr(optimizer, METRICS_METER_ATTRIBUTE, meter)
    stats = engine_stats(SimpleNamespace(optimizer=optimizer, module=torch.nn.Linear(1, 1)))
    assert stats["pinned_bytes_reserved"] == 32 * MIB  # now, not the step's end
    assert stats["host_cache_bytes_in_use"] == 7 and stats["step"] == 0  # what only the record has
    assert stats["host_cache_budget_bytes"] == 5  # the governor's at the step's end, not a swapper's at start-up
