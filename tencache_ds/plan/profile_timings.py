"""A saved profile's measured timings in place of a machine's figures, for `tencache-ds estimate --profile`. Owns:
checking that a profile (profile/store.py sections) was recorded for this workload, and turning its measured compute
time and NVMe read bandwidth into the figures the step model replays with. Does not own: the profile's format or
the replay (plan/step_model/). Pure.

What is taken from the profile, from each section's steady timings (the median of the steps that repeated the
recorded one, profile/steady.py) where it has them, else from the recorded step, the run's first, with its
first-step costs (a section saved before a step repeated it, or by an older tencache):
- compute: the "params" section's step less its I/O waits is forward, backward and the optimizer's CPU work; less
  the "optimizer" section's own waits (reads of optimizer state the update waited for) and less the model's CPU
  Adam time, it is the forward and backward. That time is more than FLOPs: the step model charges ZeRO-3's hooks
  and a host accelerator's memory work to compute beside them. The FLOP rate is the one at which the model's
  tencache compute for this workload takes the measured time (its compute is linear in the inverse rate: two
  replays give the slope), so what the model prices apart is not counted twice;
- NVMe reads: bytes over summed read durations, all sections pooled (the profile's own measure: with two reads in
  flight each one's duration includes its wait behind the other, so this is per request, not the drive's total);
  measured at the run's own request sizes, so the machine's read factors by request size are rescaled to be 1 at
  the profile's mean read.
The access sequence stays synthesised; the profile's partition sizes must match it (else it describes another
model or config and is refused).
"""
import dataclasses
from typing import Dict, List, Optional, Tuple

from ..errors import TencacheConfigError
from ..profile.steady import SteadyTimings
from ..profile.store import SavedSection
from ..units import PAGE_BYTES, fmt_bytes, round_up
from .machine import Machine
from .workload import Workload

SIZE_TOLERANCE = 0.05      # page rounding and alignment differ by far less than another model's sizes would
MIN_COMPUTE_SHARE = 0.05   # a forward + backward below this share of the step is a profile we cannot read


def machine_from_profile(machine: Machine, workload: Workload, sections: Dict[str, object],
                         source: str) -> Tuple[Machine, List[str]]:
    """``machine`` with the profile's measured figures; and one note per figure taken (for the report). Raises
    TencacheConfigError naming ``source`` when the profile has no "params" section or was recorded for another
    model or config."""
    from .step_model import optimizer_cpu_seconds
    params = sections.get("params")
    if params is None:
        raise TencacheConfigError(f"{source}: no \"params\" section (a profile of a run with parameters on NVMe and "
                                  f"a \"tencache\" block with profile_path)")
    expected = sum(round_up(workload.zero.swap_nbytes(p.part_numel), PAGE_BYTES)
                   for p in workload.partitions.values() if p.on_nvme)
    recorded = sum(params.step.tensor_nbytes().values())
    if expected == 0 or abs(recorded / expected - 1.0) > SIZE_TOLERANCE:
        raise TencacheConfigError(f"{source} [params] holds {fmt_bytes(recorded)} of parameter partitions, this "
                                  f"model and config {fmt_bytes(expected)}: it was recorded for another model or "
                                  f"config")
    notes: List[str] = []
    changes = {}
    timings = {name: _timings(section) for name, section in sections.items()}
    optimizer_waits = timings["optimizer"].stall_s if "optimizer" in timings else 0.0
    fwd_bwd_flops = sum(fetch.flops for fetch in workload.fetches) * workload.gas
    measured = timings["params"].compute_s - optimizer_waits - optimizer_cpu_seconds(workload, machine)
    fitted = _fitted_compute(machine, workload, measured) if fwd_bwd_flops > 0 else None
    if measured > MIN_COMPUTE_SHARE * timings["params"].step_s and fitted is not None:
        rate, flop_s = fitted
        changes["accelerator_flops_per_s"] = rate
        steps = (f"the median of {params.steady.steps} steps after the recorded one" if params.steady is not None
                 else "the recorded step, the run's first")
        notes.append(f"compute {measured:.3f} s per step ({steps}), of which {flop_s:.3f} s FLOPs "
                     f"({fwd_bwd_flops / flop_s / 1e9:.1f} GFLOP/s) and {measured - flop_s:.3f} s the work the "
                     f"model prices beside them")
    read_s = sum(timing.read_s for timing in timings.values())
    read_bytes = sum(timing.read_bytes for timing in timings.values())
    if read_s > 0:
        per_rank = read_bytes / read_s
        changes["nvme_read_bytes_per_s_per_drive"] = per_rank * machine.ranks_per_node / machine.drives
        notes.append(f"NVMe read {per_rank / 1e9:.2f} GB/s per rank")
        if machine.nvme_request_factors:
            # that rate is at the run's own requests' mean size: the read factors are rescaled to be 1 there
            mean_request = read_bytes / max(1, sum(timing.reads for timing in timings.values()))
            at_mean = machine.nvme_request_factor("read", int(mean_request))
            changes["nvme_request_factors"] = tuple((size, read / at_mean, write)
                                                    for size, read, write in machine.nvme_request_factors)
    if not notes:
        notes.append("nothing measured that the machine's figures lack")
    sources = dict(machine.sources)
    for key in changes:
        sources[key] = f"{source}: measured in a training step"
    if "nvme_request_factors" in changes:
        sources["nvme_request_factors"] = (f"{machine.sources.get('nvme_request_factors', 'the machine file')}; the "
                                           f"read factors rescaled to 1 at the mean read of {source}")
    return dataclasses.replace(machine, sources=sources, **changes), notes


def _timings(section: SavedSection) -> SteadyTimings:
    """The section's steady timings, else its recorded step's as if one step had repeated it."""
    return section.steady if section.steady is not None else SteadyTimings.of([section.step])



def _fitted_compute(machine: Machine, workload: Workload, measured_s: float) -> Optional[Tuple[float, float]]:
    """(accelerator_flops_per_s, the FLOP seconds at it) at which the step model's tencache compute for
    ``workload`` takes ``measured_s``; None where the work it prices beside the FLOPs already takes that long."""
    from .step_model import TENCACHE, predict

    def compute_at(rate: float) -> float:
        at = dataclasses.replace(machine, accelerator_flops_per_s=rate, io_contention=0.0)
        return predict(workload, at)[TENCACHE].critical_path_s["compute"]

    rate = machine.accelerator_flops_per_s
    flop_s = 2.0 * (compute_at(rate) - compute_at(2.0 * rate))  # compute(r) = beside + flops / r
    beside = compute_at(rate) - flop_s
    if flop_s <= 0 or measured_s - beside <= MIN_COMPUTE_SHARE * measured_s:
        return None
    return rate * flop_s / (measured_s - beside), measured_s - beside
