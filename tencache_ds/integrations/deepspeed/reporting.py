"""Start-up log line, step boundaries and the per-step metrics file. Owns: what happens at the end of every
optimizer step (the parameter swappers' step boundary, one metrics record) and where stats are emitted. The numbers
themselves come from stats.py."""
import contextlib
import os

from deepspeed import comm as dist

from ...log import logger
from ...metrics import MetricsWriter, StepMeter
from ...units import fmt_bytes
from .config_bridge import accelerator_is_host
from .coordinator import coordinator_of
from .engine_ordinals import LiveOrdinals
from .memory_pressure import GOVERNOR_ATTRIBUTE, HostTierGovernor, governor_of, stage3_prior
from .one_rank_reduce import partitions_each_gradient_at_once
from .param_swapper import TencacheParamSwapper
from .stats import METRICS_METER_ATTRIBUTE, combined_stats, gauges, running_totals

_writers = {}  # metrics path -> MetricsWriter (one file per path for the whole process)
SWAPPERS_RELEASED = "_tencache_swappers_released"  # set on a ZeRO-3 optimizer by its destroy (install.py)
_STATS_LOGGED = "_tencache_startup_stats_logged"  # on a ZeRO-3 optimizer: log_startup_stats ran
# the ZeRO-3 optimizers metering steps, per metrics path; one destroyed frees its file
_METRICS_FILES = LiveOrdinals(lambda optimizer: getattr(optimizer, SWAPPERS_RELEASED, False))


def log_startup_stats(optimizer) -> None:
    """The start-up log line of a ZeRO-3 optimizer tencache swaps for (``log_stats``, rank 0): once, at its engine's
    first forward pass (install.py), whichever of its tensors tencache swaps. Until 2026-12-07 the optimizer swapper
    logged it at its first backward: with parameters alone on NVMe nothing was logged, and with the optimizer alone
    the host cache budget read 0 B (the parameter swapper's key; helper-184's review): the host tier's resolved
    budget, which is the optimizer's where the parameters are not on NVMe."""
    if getattr(optimizer, _STATS_LOGGED, False):
        return
    param_swapper, optimizer_swapper, _coordinator = _components(optimizer)
    if param_swapper is None and optimizer_swapper is None:
        return
    setattr(optimizer, _STATS_LOGGED, True)
    if not (optimizer_swapper or param_swapper).config.log_stats or dist.get_rank() != 0:
        return
    stats = combined_stats(param_swapper, optimizer_swapper)
    budget = stats.get("host_cache_budget_bytes", stats.get("optimizer_cache_budget_bytes", 0))
    logger.info("pinned %s (stock DeepSpeed would pin %s for this config), host buffers %s, host cache budget %s; "
                "tencache_ds.stats(engine) has the details",
                fmt_bytes(stats["pinned_bytes_reserved"]), fmt_bytes(stats["stock_pinned_bytes_estimate"]),
                fmt_bytes(stats["host_bytes_reserved"]), fmt_bytes(budget))


def param_swappers_of_module(module):
    """The tencache parameter swappers of ``module``'s parameters, frozen ones included (usually one)."""
    found = {}
    for param in module.parameters() if module is not None else ():
        swapper = getattr(param, "nvme_swapper", None)
        if isinstance(swapper, TencacheParamSwapper):
            found[id(swapper)] = swapper
    return list(found.values())


def param_swappers_of_optimizer(optimizer):
    """The tencache parameter swappers of a ZeRO-3 optimizer's parameters (usually one)."""
    found = {}
    for group in getattr(optimizer, "fp16_groups", None) or []:
        for param in group:
            swapper = getattr(param, "nvme_swapper", None)
            if isinstance(swapper, TencacheParamSwapper):
                found[id(swapper)] = swapper
    return list(found.values())


def _components(optimizer):
    param_swappers = param_swappers_of_optimizer(optimizer)
    return (param_swappers[0] if param_swappers else None), optimizer_swapper_of_optimizer(optimizer), \
        coordinator_of(optimizer)


def optimizer_swapper_of_optimizer(optimizer):
    swapper = getattr(optimizer, "optimizer_swapper", None)
    return swapper if hasattr(swapper, "stock_pinned_bytes_estimate") else None


def attach_step_meter(optimizer) -> None:
    """A built ZeRO-3 optimizer: start metering its steps, and governing its host tier under memory pressure, if
    tencache swaps any of its tensors (from now on, so that the first step's numbers do not include building the
    engine)."""
    param_swapper, optimizer_swapper, coordinator = _components(optimizer)
    if param_swapper is None and optimizer_swapper is None:
        return
    meter = StepMeter(start=running_totals(param_swapper, optimizer_swapper, coordinator))
    metrics_path = (param_swapper or optimizer_swapper).config.metrics_path
    if metrics_path:
        meter.path = engine_metrics_file(metrics_path, optimizer)
    setattr(optimizer, METRICS_METER_ATTRIBUTE, meter)
    setattr(optimizer, GOVERNOR_ATTRIBUTE,
            HostTierGovernor(param_swappers_of_optimizer(optimizer), optimizer_swapper, coordinator,
                             prior=stage3_prior(optimizer, accelerator_is_host(),
                                                partitions_each_gradient_at_once(optimizer))))


def restart_metering(optimizer, next_step: int) -> None:
    """engine.load_checkpoint is done (install.py wraps it): the meter starts again from here, so that the next
    metrics record holds the next step's own I/O and time, not the load's (its reads of the checkpoint, the
    engine's swap-ins that follow them), numbered ``next_step`` (the engine's global step: the record the run that
    saved would have written next; a resumed run appending to its metrics file numbered from 0 again)."""
    meter = getattr(optimizer, METRICS_METER_ATTRIBUTE, None)
    if meter is not None:
        meter.restart(running_totals(*_components(optimizer)), next_step)


def on_optimizer_step_end(optimizer) -> None:
    """Stage 3 finished an optimizer step (its _post_step)."""
    meter = getattr(optimizer, METRICS_METER_ATTRIBUTE, None)
    if meter is None:
        return
    for swapper in param_swappers_of_optimizer(optimizer):
        swapper.end_optimizer_step()
    governor = governor_of(optimizer)
    if governor is not None:
        governor.end_optimizer_step()
    param_swapper, optimizer_swapper, coordinator = _components(optimizer)
    metrics = meter.step_end(running_totals(param_swapper, optimizer_swapper, coordinator),
                             gauges(param_swapper, optimizer_swapper, coordinator, governor),
                             device_tier_applies=coordinator is None or not coordinator.gathers_alias_partitions)
    if coordinator is not None:
        coordinator.restart_device_peak()  # the next step's peak
    if meter.path is None or dist.get_rank() != 0:
        return
    try:
        writer = _writers.get(meter.path)
        if writer is None:
            writer = _writers[meter.path] = MetricsWriter(meter.path)
        writer.write(metrics)
    except OSError as err:
        # rank 0 alone writes: raised here (after the update, before the engine counts the step) it stopped that
        # rank only, and the others waited in their next collective (helper-218). Said once for this engine, whose
        # records stop; training goes on (a later engine given the path tries again: helper-219).
        failed = _writers.pop(meter.path, None)
        if failed is not None:
            with contextlib.suppress(OSError):
                failed.close()
        logger.error("tencache: tencache.metrics_path %s cannot be written (%s): this engine writes no more "
                     "metrics records; training goes on", meter.path, err)
        meter.path = None


def engine_metrics_file(metrics_path: str, optimizer) -> str:
    """The file ``optimizer``'s engine appends its records to: its ordinal among the engines alive that meter to
    ``metrics_path`` (one file, however its path is spelled: helper-174)."""
    return engine_metrics_path(metrics_path, _METRICS_FILES.claim(os.path.abspath(metrics_path), optimizer))


def engine_metrics_path(metrics_path: str, ordinal: int) -> str:
    """Where an engine's metrics records go: ``metrics_path`` for the first engine alive in the process,
    ``<root>.engine2<ext>`` for a second alive beside it (an actor and a critic), and so on (engine_ordinals.py).
    In one file, both engines' records were numbered from 0 with nothing to tell them apart (helper-173)."""
    if ordinal == 0:
        return metrics_path
    root, ext = os.path.splitext(metrics_path)
    return f"{root}.engine{ordinal + 1}{ext}"
