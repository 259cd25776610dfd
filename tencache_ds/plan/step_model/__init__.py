"""The step model: a training step's time, bytes and memory on a machine, under stock ZeRO-Infinity or tencache,
before anything runs. Owns: replaying one rank's step (plan/workload.py: its gathers, gradients and optimizer
sub-groups) on a timeline of the compute thread and the machine's channels (NVMe read, NVMe write, H2D), with
each policy's rules for when bytes move and who waits; and the memory each tier needs. Does not own: the budgets
tencache chooses (plan/budget.py, plan/host_tier.py, plan/device_tier.py, plan/size_classes.py decide them here
as at run time, and plan/memory_pressure.py how far an "auto" budget grows), which accesses a host tier of a
given size serves (plan/host_residency.py) or how far ahead a read is issued (plan/prefetch.py). Pure: no clock,
no I/O, no torch.

The model's parts, one module each: timeline.py (the clock and the channels), drive.py (the NVMe requests in
flight, sharing the drive), costs.py (what both policies share: tensor bytes, common memory, the optimizer step's
CPU time), stock.py and tencache.py (each policy's replay and memory), results.py (the Prediction, fits, drive
wear). This module is the public face: predict() runs both.

Known simplifications (docs/estimate.md lists them with their effect): collective communication (stage 3's
all-gathers and reduce-scatters between ranks) only as a machine file measures it (``allgather_bytes_per_s``,
``reduce_scatter_bytes_per_s``: `--machine this` does, at 2 ranks), and then on the compute thread, as gloo runs on
a host accelerator (a GPU's NCCL would overlap part of it with compute; the GPU files have no figure); per-module
framework overhead only as a machine file measures it (ZeRO-3's hooks, ``zero3_module_call_s``); the drive's cost
to the cores only as a machine file measures it (``io_contention``: work beside the drive slows, the drive beside
work does not; timeline.py); host memory bandwidth is one figure for every copy.
"""
import dataclasses
from typing import Dict

from ...config import AUTO
from ..machine import Machine
from ..workload import Workload
from .costs import optimizer_cpu_seconds
from .results import STOCK, TENCACHE, Prediction, drive_days_to_tbw, fits
from .stock import predict_stock
from .tencache import TencachePlan, predict_tencache, tencache_plan


def predict(workload: Workload, machine: Machine) -> Dict[str, Prediction]:
    """Both policies: stock ZeRO-Infinity, and tencache with the budgets it would choose (its "tencache" block from
    the DeepSpeed config, else the defaults: "auto" budgets)."""
    from ...config import TencacheConfig
    if "nvme" not in (workload.zero.offload_param, workload.zero.offload_optimizer):
        # tencache replaces the NVMe swappers only: without NVMe offload the run is stock DeepSpeed
        stock = predict_stock(workload, machine)
        return {STOCK: stock, TENCACHE: dataclasses.replace(stock, policy=TENCACHE)}
    tencache_workload = workload if workload.zero.tencache is not None else dataclasses.replace(
        workload, zero=dataclasses.replace(workload.zero, tencache=TencacheConfig(host_cache_bytes=AUTO,
                                                                                  device_cache_bytes=AUTO)))
    return {STOCK: predict_stock(workload, machine), TENCACHE: predict_tencache(tencache_workload, machine)}


__all__ = ["STOCK", "TENCACHE", "Prediction", "TencachePlan", "predict", "predict_stock", "predict_tencache",
           "tencache_plan", "fits", "drive_days_to_tbw", "optimizer_cpu_seconds"]
