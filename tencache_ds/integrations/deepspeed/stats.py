"""tencache_ds.stats(engine): one flat dict about the swappers of a DeepSpeed engine, tencache's or stock's.
Owns: finding the swappers and the coordinator of an engine, and reading their numbers into stable key names and
into the typed running totals and gauges that per-step metrics (tencache_ds/metrics.py) are made of."""
from typing import Dict, Optional

from ...io.activity import PROCESS_ACTIVITY
from ...memory.pinning import torch_host_allocator_bytes
from ...metrics import Gauges, RunningTotals
from .coordinator import coordinator_of
from .gradient_norms import norm_scratch_of
from .memory_pressure import governor_of
from .one_rank_reduce import gradients_partitioned_at_once, reductions_without_copy

METRICS_METER_ATTRIBUTE = "_tencache_step_meter"  # on the ZeRO-3 optimizer: its StepMeter (reporting.py)


def param_swapper_of(engine) -> Optional[object]:
    for param in engine.module.parameters():
        swapper = getattr(param, "nvme_swapper", None)
        if swapper is not None:
            return swapper
    return None


def optimizer_swapper_of(engine) -> Optional[object]:
    return getattr(getattr(engine, "optimizer", None), "optimizer_swapper", None)


# the gauges engine_stats reads now, which the last step's record (read then) does not replace
READ_NOW = ("pinned_bytes_reserved", "device_cache_bytes_in_use")


def engine_stats(engine) -> Dict[str, object]:
    """combined_stats, the coordinator's device tier, and the latest step's metrics (the metrics file's last line,
    under the schema's keys; ``nvme_*_bytes`` stay running totals here, the step's are ``step_nvme_*_bytes``)."""
    optimizer = getattr(engine, "optimizer", None)
    param_swapper, optimizer_swapper = param_swapper_of(engine), optimizer_swapper_of(engine)
    stats = combined_stats(param_swapper, optimizer_swapper)
    # which classes really swap this engine's tensors (a half-stock engine shows here, not just in the numbers)
    stats.update(param_swapper_class=type(param_swapper).__name__ if param_swapper is not None else None,
                 optimizer_swapper_class=type(optimizer_swapper).__name__ if optimizer_swapper is not None else None)
    coordinator = coordinator_of(optimizer)
    if coordinator is not None and coordinator.tier is not None:
        stats.update(device_cache_budget_bytes=coordinator.tier.budget_bytes,
                     device_cache_bytes_in_use=coordinator.device_cache_bytes_in_use(),
                     device_tier_applicable=int(not coordinator.gathers_alias_partitions),
                     device_param_fetches=coordinator.param_fetches, device_hits=coordinator.device_hits,
                     device_fetch_bytes_total=coordinator.fetch_bytes, device_gathers_total=coordinator.gathers,
                     device_fetch_s_total=coordinator.fetch_s,
                     device_tier_admitted=coordinator.tier.admitted, device_tier_evicted=coordinator.tier.evicted)
    governor = governor_of(optimizer)
    if governor is not None:
        stats.update(host_pressure_shrinks=governor.shrinks, host_pressure_grows=governor.grows,
                     host_rise_boundaries=governor.rise_boundaries,
                     # the reduce's buffers the reserve counts though the step does not take them (plan/memory_pressure)
                     host_rise_kept_bytes=governor.policy.prior.kept_rise_bytes,
                     host_memory_bound_by=governor.last_memory.bound_by if governor.last_memory else None)
    if governor is not None:  # tencache swaps for this optimizer (one_rank_reduce.py)
        stats.update(gradient_reductions_without_copy=reductions_without_copy(optimizer),
                     gradients_partitioned_at_once=gradients_partitioned_at_once(optimizer))
    scratch = norm_scratch_of(optimizer)
    if scratch is not None:  # the clipping norms' float64 copies (gradient_norms.py)
        stats.update(gradient_norms_in_reused_memory=scratch.views,
                     gradient_norms_above_scratch_ceiling=scratch.refused,
                     gradient_norm_scratch_peak_bytes=scratch.peak_bytes,
                     gradient_norm_scratch_allocations=scratch.grows)
    meter = getattr(optimizer, METRICS_METER_ATTRIBUTE, None)
    if meter is not None and meter.latest is not None:
        latest = meter.latest.flat()
        latest["step_nvme_read_bytes"] = latest.pop("nvme_read_bytes")
        latest["step_nvme_write_bytes"] = latest.pop("nvme_write_bytes")
        latest["metrics_schema"] = latest.pop("schema")
        # the last step's end, beside what was read now: a gauge read now (pinned bytes, the device tier's) is not
        # replaced by the one read then (after a load, an eval, a gather: helper-173); the host budget is the
        # record's, the governor's (the parameter swapper's own is its start-up budget: helper-174)
        stats.update({key: value for key, value in latest.items() if key not in READ_NOW})
    return stats


def running_totals(param_swapper, optimizer_swapper, coordinator) -> RunningTotals:
    """The typed running totals of tencache's components (zeros for a component that is absent or stock)."""
    totals = {"param_nvme_wait_s": 0.0, "optimizer_nvme_wait_s": 0.0, "host_hits": 0, "host_misses": 0,
              "nvme_read_bytes": 0, "nvme_write_bytes": 0, "prefetch_issued": 0, "prefetch_late": 0}
    for swapper, wait_key in ((param_swapper, "param_nvme_wait_s"), (optimizer_swapper, "optimizer_nvme_wait_s")):
        store = getattr(swapper, "store", None)
        if store is None or not hasattr(swapper, "stock_pinned_bytes_estimate"):
            continue
        counters, io = store.counters, swapper.io.counters()
        totals[wait_key] += counters.io_wait_s
        totals["host_hits"] += counters.hits
        totals["host_misses"] += counters.misses
        totals["prefetch_issued"] += counters.prefetch_issued
        totals["prefetch_late"] += counters.prefetch_late
        totals["nvme_read_bytes"] += io.read_bytes
        totals["nvme_write_bytes"] += io.write_bytes
    totals["nvme_busy_s"], totals["nvme_depth_s"] = PROCESS_ACTIVITY.totals()  # every engine of this process
    if coordinator is not None:
        totals.update(device_fetches=coordinator.param_fetches, device_hits=coordinator.device_hits,
                      device_fetch_bytes=coordinator.fetch_bytes, device_gathers=coordinator.gathers,
                      device_fetch_s=coordinator.fetch_s)
    return RunningTotals(**totals)


def gauges(param_swapper, optimizer_swapper, coordinator, governor=None) -> Gauges:
    stats = combined_stats(param_swapper, optimizer_swapper)
    memory = governor.last_memory if governor is not None else None
    return Gauges(pinned_bytes_reserved=int(stats.get("pinned_bytes_reserved", 0)),
                  pinned_bytes_in_use=_locked_part(stats, "param", "in_use_bytes")
                  + _locked_part(stats, "optimizer", "in_use_bytes"),
                  host_cache_bytes_in_use=int(stats.get("param_kept_bytes", 0))
                  + int(stats.get("optimizer_cache_kept_bytes", 0)),
                  device_cache_bytes_in_use=coordinator.device_cache_bytes_in_use() if coordinator is not None else 0,
                  device_cache_peak_bytes=coordinator.device_cache_peak_bytes() if coordinator is not None else 0,
                  host_cache_budget_bytes=governor.budget_bytes if governor is not None
                  else int(stats.get("host_cache_budget_bytes", 0)),
                  host_memory_available_bytes=memory.available_bytes if memory is not None else 0,
                  host_step_rise_bytes=governor.policy.step_rise_bytes if governor is not None else 0)


def combined_stats(param_swapper, optimizer_swapper) -> Dict[str, object]:
    """The headline keys first (pinned_bytes_reserved, pinned_bytes_peak_in_use, nvme_read_bytes,
    nvme_write_bytes, stock_pinned_bytes_estimate), then every component's own numbers."""
    # tencache's swappers are the ones that report their own stats (stock ones are read from outside).
    ours = [s for s in (param_swapper, optimizer_swapper) if hasattr(s, "stock_pinned_bytes_estimate")]
    if not ours:
        return _stock_stats(param_swapper, optimizer_swapper)
    detail: Dict[str, object] = {}
    for swapper in ours:
        detail.update(swapper.stats())
    stock_estimate = sum(s.stock_pinned_bytes_estimate() for s in ours)
    torch_pinned = torch_host_allocator_bytes()  # DeepSpeed's own pinned buffers, beside tencache's
    detail["torch_pinned_bytes"] = torch_pinned
    headline = {
        "tencache_enabled": 1,
        "pinned_bytes_reserved": _pinned(detail, "param") + _pinned(detail, "optimizer") + _staging(detail)
        + torch_pinned,
        "pinned_bytes_peak_in_use": _locked_part(detail, "param", "peak_in_use_bytes")
        + _locked_part(detail, "optimizer", "peak_in_use_bytes") + _staging(detail) + torch_host_allocator_bytes(peak=True),
        "host_bytes_reserved": _host_mapped(detail, "param") + _host_mapped(detail, "optimizer"),
        "nvme_read_bytes": int(detail.get("param_nvme_read_bytes", 0)) + int(detail.get("optimizer_nvme_read_bytes", 0)),
        "nvme_write_bytes": int(detail.get("param_nvme_write_bytes", 0)) + int(detail.get("optimizer_nvme_write_bytes", 0)),
        "buffer_fallbacks": int(detail.get("param_buffer_fallbacks", 0)) + int(detail.get("optimizer_buffer_fallbacks", 0)),
        "waits_for_slots": int(detail.get("param_waits_for_slots", 0))
        + int(detail.get("optimizer_cache_waits_for_slots", 0)),
        "stock_pinned_bytes_estimate": stock_estimate,
    }
    headline.update(detail)
    return headline


def _pinned(detail, prefix) -> int:
    """Page-locked bytes: by mlock, or by cudaHostRegister (which locks pages itself)."""
    return max(int(detail.get(f"{prefix}_locked_bytes", 0)), int(detail.get(f"{prefix}_registered_bytes", 0)))


def _staging(detail) -> int:
    """The stores' device-to-host staging chunks (memory/device_staging.py), registered at the first device copy."""
    return sum(int(detail.get(f"{prefix}staging_registered_bytes", 0)) for prefix in ("param_", "optimizer_cache_"))


def _locked_part(detail, prefix, key) -> int:
    """Of the slots' ``key`` bytes (in use now, or at the peak), those page-locked: all where every live slot (not
    retired) is locked, else at most what is locked. The optimizer's pool is never locked (its state is pageable by
    design), nor are slots on the CPU accelerator: their bytes in use counted as pinned until 2026-12-07, 1.45 GiB
    with nothing locked (helper-184's review)."""
    live = int(detail.get(f"{prefix}_reserved_bytes", 0)) - int(detail.get(f"{prefix}_retired_bytes", 0))
    locked = _pinned(detail, prefix)
    amount = int(detail.get(f"{prefix}_{key}", 0))
    return amount if live > 0 and locked >= live else min(amount, locked)


def _host_mapped(detail, prefix) -> int:
    """A pool's host memory: its slots but those retired (their pages given back), its pageable buffers and its
    fallback buffers. Until 2026-12-07 the optimizer's slots and both pools' fallbacks were left out, and retired
    parameter slots counted (helper-184's review)."""
    return (int(detail.get(f"{prefix}_reserved_bytes", 0)) - int(detail.get(f"{prefix}_retired_bytes", 0))
            + int(detail.get(f"{prefix}_pageable_bytes_in_use", 0))
            + int(detail.get(f"{prefix}_fallback_bytes_in_use", 0)))


def _stock_locked_bytes(param_swapper, optimizer_swapper) -> int:
    """Bytes stock swappers actually locked: the param slot pool and write-back staging, the optimizer pool."""
    total = 0
    if param_swapper is not None:
        for name in ("buffers", "partitioned_swap_buffer"):
            tensor = getattr(param_swapper, name, None)
            if tensor is not None:
                total += tensor.numel() * tensor.element_size()
    manager = getattr(optimizer_swapper, "swap_buffer_manager", None)
    for tensor in getattr(manager, "all_buffers", []) or []:
        total += tensor.numel() * tensor.element_size()
    return total


def _stock_stats(param_swapper, optimizer_swapper) -> Dict[str, object]:
    swap_buffers = _stock_locked_bytes(param_swapper, optimizer_swapper)
    # On a GPU stock CPU offload pins its optimizer state and buffers through torch (no swapper, no mlock).
    torch_pinned = torch_host_allocator_bytes()
    locked = swap_buffers + torch_pinned
    # Stock pools are locked whole at start-up, so reserved = peak in use = what is locked.
    return {"tencache_enabled": 0, "pinned_bytes_reserved": locked, "pinned_bytes_peak_in_use": locked,
            "host_bytes_reserved": locked, "stock_pinned_bytes_estimate": locked,
            "torch_pinned_bytes": torch_pinned}
