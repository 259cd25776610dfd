"""A saved profile's measured timings in place of a machine's figures, for `tencache-ds estimate --profile`. Owns:
checking that a profile (profile/store.py sections) was recorded for this workload, and turning its measured compute
time and NVMe read bandwidth into the figures the step model replays with. Does not own: the profile's format or
the replay (plan/step_model/). Pure.

What is taken from the profile:
- compute: the "params" section's step less its I/O waits is forward, backward and the optimizer's CPU work; less
  the "optimizer" section's own waits (reads of optimizer state the update waited for) and less the model's CPU
  Adam time, it is the forward and backward, which sets the FLOP rate;
- NVMe reads: bytes over summed read durations, all sections pooled (the profile's own measure: with two reads in
  flight each one's duration includes its wait behind the other, so this is per request, not the drive's total);
  measured at the run's own request sizes, so the machine's read factors by request size are rescaled to be 1 at
  the profile's mean read.
The access sequence stays synthesised; the profile's partition sizes must match it (else it describes another
model or config and is refused).
"""
import dataclasses
from typing import Dict, List, Tuple

from ..errors import TencacheConfigError
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
    optimizer = sections.get("optimizer")
    optimizer_waits = optimizer.step.total_stall_s if optimizer is not None else 0.0
    fwd_bwd_flops = sum(fetch.flops for fetch in workload.fetches) * workload.gas
    measured = params.step.compute_s - optimizer_waits - optimizer_cpu_seconds(workload, machine)
    if measured > MIN_COMPUTE_SHARE * params.step.step_s and fwd_bwd_flops > 0:
        changes["accelerator_flops_per_s"] = fwd_bwd_flops / measured * machine.ranks_per_compute_figure
        notes.append(f"compute {measured:.3f} s per step ({fwd_bwd_flops / measured / 1e9:.1f} GFLOP/s)")
    read_s = sum(section.step.measured_read_s for section in sections.values())
    read_bytes = sum(section.step.read_bytes for section in sections.values())
    if read_s > 0:
        per_rank = read_bytes / read_s
        changes["nvme_read_bytes_per_s_per_drive"] = per_rank * machine.ranks_per_node / machine.drives
        notes.append(f"NVMe read {per_rank / 1e9:.2f} GB/s per rank")
        if machine.nvme_request_factors:
            # that rate is at the run's own requests' mean size: the read factors are rescaled to be 1 there
            mean_request = read_bytes / max(1, sum(section.step.measured_reads for section in sections.values()))
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
