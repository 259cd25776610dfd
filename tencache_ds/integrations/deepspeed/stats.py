"""tencache_ds.stats(engine): one flat dict about the swappers of a DeepSpeed engine, tencache's or stock's.
Owns: finding the swappers of an engine and combining their numbers under stable key names."""
from typing import Dict, Optional


# Running totals that per-step metrics turn into deltas.
COUNTER_KEYS = ("nvme_read_bytes", "nvme_write_bytes", "buffer_fallbacks", "waits_for_slots")


def param_swapper_of(engine) -> Optional[object]:
    for param in engine.module.parameters():
        swapper = getattr(param, "nvme_swapper", None)
        if swapper is not None:
            return swapper
    return None


def optimizer_swapper_of(engine) -> Optional[object]:
    return getattr(getattr(engine, "optimizer", None), "optimizer_swapper", None)


def engine_stats(engine) -> Dict[str, object]:
    return combined_stats(param_swapper_of(engine), optimizer_swapper_of(engine))


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
    headline = {
        "tencache_enabled": 1,
        "pinned_bytes_reserved": _pinned(detail, "param") + _pinned(detail, "optimizer"),
        "pinned_bytes_peak_in_use": _locked_peak(detail, "param") + _locked_peak(detail, "optimizer"),
        "host_bytes_reserved": int(detail.get("param_reserved_bytes", 0))
        + int(detail.get("optimizer_pageable_bytes_in_use", 0)),
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


def _locked_peak(detail, prefix) -> int:
    reserved = int(detail.get(f"{prefix}_reserved_bytes", 0))
    locked = _pinned(detail, prefix)
    peak = int(detail.get(f"{prefix}_peak_in_use_bytes", 0))
    return peak if reserved and locked == reserved else min(peak, locked)


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
    locked = _stock_locked_bytes(param_swapper, optimizer_swapper)
    # Stock pools are locked whole at start-up, so reserved = peak in use = what is locked.
    return {"tencache_enabled": 0, "pinned_bytes_reserved": locked, "pinned_bytes_peak_in_use": locked,
            "host_bytes_reserved": locked, "stock_pinned_bytes_estimate": locked}
