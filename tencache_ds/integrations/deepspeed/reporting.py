"""Start-up log line and per-step metrics file for tencache's swappers. Owns: when and where stats are emitted.
The numbers themselves come from stats.combined_stats."""
from deepspeed import comm as dist

from ...log import logger
from ...metrics import MetricsWriter
from ...units import fmt_bytes
from .stats import COUNTER_KEYS, combined_stats

_writers = {}  # metrics path -> MetricsWriter (one file per path for the whole process)


def log_startup_stats(param_swappers, optimizer_swapper) -> None:
    config = optimizer_swapper.config
    if not config.log_stats or dist.get_rank() != 0:
        return
    stats = combined_stats(param_swappers[0] if param_swappers else None, optimizer_swapper)
    logger.info("pinned %s (stock DeepSpeed would pin %s for this config), host buffers %s, host cache budget %s; "
                "tencache_ds.stats(engine) has the details",
                fmt_bytes(stats["pinned_bytes_reserved"]), fmt_bytes(stats["stock_pinned_bytes_estimate"]),
                fmt_bytes(stats["host_bytes_reserved"]), fmt_bytes(stats.get("host_cache_budget_bytes", 0)))


def write_step_metrics(config, param_swappers, optimizer_swapper) -> None:
    if not config.metrics_path or dist.get_rank() != 0:
        return
    writer = _writers.get(config.metrics_path)
    if writer is None:
        writer = _writers[config.metrics_path] = MetricsWriter(config.metrics_path, COUNTER_KEYS)
    writer.write(combined_stats(param_swappers[0] if param_swappers else None, optimizer_swapper))
