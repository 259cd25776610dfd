"""A saved profile's measured timings in place of a machine's figures, for `tencache-ds estimate --profile`. Owns:
checking that a profile (profile/store.py sections) was recorded for this workload, and turning its measured compute
time into the FLOP rate the step model replays with. Does not own: the profile's format or the replay
(plan/step_model/). Pure.

What is taken from the profile: from its steady timings (profile/steady.py: the steps that repeated the recorded
one) where every section has them, else from the recorded steps, the run's first, with their first-step costs (a
profile saved before a step repeated it, or by an older tencache); never the two mixed:
- compute: the "params" section's step less its I/O waits is forward, backward and the optimizer's CPU work; less
  the "optimizer" section's own waits (reads of optimizer state the update waited for) and less the model's CPU
  Adam time, it is the forward and backward. That time is more than FLOPs: the step model charges ZeRO-3's hooks
  and a host accelerator's memory work to compute beside them, and the training thread's collectives and H2D
  copies to parts of their own. The FLOP rate is the one at which the model's tencache step spends the measured
  time on those parts together, so what the model prices apart is not counted twice. That includes the drive's
  cost to the cores (``io_contention``) where the profile's run read or wrote while it computed (a model beyond
  the host's memory, whose "auto" budget cannot hold what it trains): the fit replays with the machine's term, and
  the prediction adds it once. Until 2026-12-06 the fit left it at 0 and gpt2-1.3b's predictions counted it twice;
  where the run moved no bytes while it computed the term adds nothing either way;
- NVMe reads: reported, not taken. The profile times each read from issue to completion; with several in flight
  (tencache keeps them so) each one's time holds its wait behind the others, so bytes over summed times is a
  rate per request, not the drive's. Taken as the drive's rate it made gpt2-1.3b's stock step 93 s where it
  took 60 s (docs/estimate.md, run 20); the machine's drive figures (`--machine this` measures them with
  tencache's own engine at its queue depth) stay.
The access sequence stays synthesised; the profile's partition sizes must match it, and the gradient accumulation
and world size it was recorded with must be this estimate's (else it describes another model or config and is
refused).
Micro-batch and sequence length are not recorded (they change no access): a profile of other ones prices compute
at their token count.
"""
import dataclasses
from typing import Dict, List, Tuple

from ..errors import TencacheConfigError
from ..profile.steady import SteadyTimings
from ..profile.store import SavedSection
from ..units import PAGE_BYTES, fmt_bytes, round_up
from .machine import Machine
from .workload import Workload

SIZE_TOLERANCE = 0.05      # page rounding and alignment differ by far less than another model's sizes would
MIN_COMPUTE_SHARE = 0.05   # a forward + backward below this share of the step is a profile we cannot read
MIN_FLOP_SHARE = 0.05      # FLOPs below this share of the measured forward + backward: the model's other work
                           # there is priced higher than the run spent on all of it, and no rate would fit
# the parts of a replayed step spent on the training thread between its I/O waits (plan/step_model/results.py)
THREAD_PARTS = ("compute", "collective", "h2d")
FLOP_FREE_RATE_FACTOR = 1e6  # a rate this many times the machine's prices the FLOPs at next to nothing
FIT_TOLERANCE = 1e-6         # of the measured seconds: where the fitted rate's replay lands
FIT_MAX_REPLAYS = 60         # per phase: one where the thread's time is linear in 1 / rate, a few where near it


def check_profile_fits(workload: Workload, sections: Dict[str, SavedSection], source: str) -> None:
    """Raises TencacheConfigError naming ``source`` when the profile has no "params" section or was recorded for
    another model or config (its partitions' bytes, its gradient accumulation, micro-batch or world size). Needs no
    machine:
    `tencache-ds estimate --machine this` asks before its calibration, which a profile refused after it wasted."""
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
    # Gradient accumulation repeats the forward and backward, and the micro-batch sizes them, without changing a
    # partition's size: a profile of another GAS or micro-batch would fit this step's compute to another number of
    # micro steps or tokens (the rate off by their ratio; helper-244: micro-batch 2's profile priced micro-batch 8
    # at 761 GFLOP/s on two cores). Profiles before 2026-12-06 did not record the micro-batch.
    for fact, this_run in (("gradient_accumulation_steps", workload.gas), ("world_size", workload.world_size),
                           ("train_micro_batch_size_per_gpu", workload.micro_batch)):
        recorded_with = params.facts.get(fact)
        if recorded_with is not None and recorded_with != this_run:
            raise TencacheConfigError(f"{source} [params] was recorded with {fact} {recorded_with}, this estimate "
                                      f"has {this_run}: its step times are another config's")


def _of_this_model(workload: Workload, params: SavedSection, section: SavedSection) -> bool:
    """Can the optimizer's ``section`` have been recorded with ``params`` for this model: at its world size, its
    masters this model's per rank (the elements its swapper registered; within SIZE_TOLERANCE: alignment)? A file
    keeps the sections of every run that wrote it, and neither their times nor anything else says which run wrote
    which (a run saves its parameters' section after its optimizer's, or before)."""
    ranks, params_ranks = section.facts.get("world_size"), params.facts.get("world_size")
    if ranks is not None and params_ranks is not None and ranks != params_ranks:
        return False
    elements = section.facts.get("elements")
    masters = sum(workload.sub_group_elements(i) for i in range(len(workload.sub_groups)))
    return elements is None or (masters > 0 and abs(elements / masters - 1.0) <= SIZE_TOLERANCE)


def machine_from_profile(machine: Machine, workload: Workload, sections: Dict[str, SavedSection],
                         source: str) -> Tuple[Machine, List[str]]:
    """``machine`` with the profile's measured figures; and one note per figure taken (for the report). Raises
    as ``check_profile_fits``."""
    from .step_model import optimizer_cpu_seconds
    check_profile_fits(workload, sections, source)
    params = sections["params"]
    notes: List[str] = []
    # only the optimizer section of the run that recorded [params]: a file keeps the sections other runs wrote
    # (another model's, whose run recorded none: the optimizer on cpu, or a single step), whose waits would come off
    # this compute and whose missing repeats would put its medians aside (helper-199, helper-200)
    dropped = [name for name in sections
               if name.startswith("optimizer") and not _of_this_model(workload, params, sections[name])]
    sections = {name: section for name, section in sections.items() if name not in dropped}
    changes = {}
    steady = all(section.steady is not None for section in sections.values())
    timings = {name: section.steady if steady else SteadyTimings.of([section.step])
               for name, section in sections.items()}
    optimizer_waits = timings["optimizer"].stall_s if "optimizer" in timings else 0.0
    fwd_bwd_flops = sum(fetch.flops for fetch in workload.fetches) * workload.gas
    measured = timings["params"].compute_s - optimizer_waits - optimizer_cpu_seconds(workload, machine)
    if measured > MIN_COMPUTE_SHARE * timings["params"].step_s and fwd_bwd_flops > 0:
        steps = (f"the median of {params.steady.steps} steps after the recorded one" if steady
                 else "the recorded step, the run's first")
        rate, flop_s, beside, contended = _fitted_compute(machine, workload, measured)
        if flop_s >= MIN_FLOP_SHARE * measured:
            changes["accelerator_flops_per_s"] = rate
            notes.append(f"compute {measured:.3f} s per step ({steps}), of which {flop_s:.3f} s FLOPs "
                         f"({fwd_bwd_flops / flop_s / 1e9:.1f} GFLOP/s), {beside:.3f} s the work the model "
                         f"prices beside them and {contended:.3f} s the drive's cost to the cores "
                         f"(io_contention {machine.io_contention:.2f})")
        else:
            notes.append(f"compute not taken: {measured:.3f} s per step measured ({steps}), and the model prices "
                         f"{beside + contended:.3f} s of other work on the training thread there (the drive's cost "
                         f"to the cores included): no FLOP rate fits")
    read_s = sum(timing.read_s for timing in timings.values())
    if read_s > 0:  # reported, not taken: see the module's docstring
        per_request = sum(timing.read_bytes for timing in timings.values()) / read_s
        notes.append(f"NVMe reads {per_request / 1e9:.2f} GB/s per request, not taken for the drive's rate (with "
                     f"several in flight, each one's time holds its wait behind the others)")
    if not notes:
        notes.append("nothing measured that the machine's figures lack")
    if dropped:
        notes.append(f"section(s) {', '.join(dropped)} not taken: recorded by another run (another world size, or "
                     f"another model's masters)")
    sources = dict(machine.sources)
    for key in changes:
        sources[key] = f"{source}: " + ("medians of the training steps that repeated the recorded one" if steady
                                        else "the recorded training step")
    return dataclasses.replace(machine, sources=sources, **changes), notes


def _fitted_compute(machine: Machine, workload: Workload,
                    measured_s: float) -> Tuple[float, float, float, float]:
    """(accelerator_flops_per_s, the FLOP seconds at it, the seconds of the work the model prices beside the FLOPs,
    the seconds the drive costs the cores there: ``io_contention``) for which the step model's tencache step spends
    ``measured_s`` on THREAD_PARTS, the three seconds adding up to it (within FIT_TOLERANCE). Where no rate fits
    (the model prices more than ``measured_s`` with the FLOPs at next to nothing): the machine's rate,
    ``measured_s`` less that least time (at most 0), that least time, 0.

    The replays keep the machine's ``io_contention``: the profile run's steps were slowed by its own reads and
    writes as much as the model prices them, so what the fit leaves to the FLOPs is the work without them, and the
    prediction does not add the drive's cost to the cores a second time. Without the term the thread's time is
    linear in the inverse rate; with it, the seconds lost beside the drive move with how long the work takes, so
    the rate is found on that inverse by regula falsi within a bracket of the root."""
    from .step_model import TENCACHE, predict

    def thread_s(rate: float, io_contention: float = machine.io_contention) -> float:
        at = dataclasses.replace(machine, accelerator_flops_per_s=rate, io_contention=io_contention)
        parts = predict(workload, at)[TENCACHE].critical_path_s
        return sum(parts[name] for name in THREAD_PARTS)

    rate = machine.accelerator_flops_per_s
    fastest = 1.0 / (rate * FLOP_FREE_RATE_FACTOR)  # u = 1 / rate at which the FLOPs take next to nothing
    least = thread_s(1.0 / fastest)
    if measured_s <= least:
        return rate, measured_s - least, least, 0.0
    # The root of err(u) = thread_s(1 / u) - measured_s, bracketed between u_low (err < 0: the FLOP-free point) and
    # u_high (err > 0, found by doubling from the machine's rate), by the Illinois method (regula falsi that halves
    # the weight of an end kept twice): one step where err is linear in u, as without the term; within the bracket
    # always, where the term makes err jump (a piece of work starts or stops overlapping a request) and a plain
    # secant was seen to cycle. With no exact root at a jump, the end nearer to it.
    tolerance = FIT_TOLERANCE * measured_s
    u_low, err_low = fastest, least - measured_s
    u_high, err_high = 1.0 / rate, thread_s(rate) - measured_s
    for _ in range(FIT_MAX_REPLAYS):
        if err_high > 0:
            break
        u_low, err_low = u_high, err_high
        u_high *= 2.0
        err_high = thread_s(1.0 / u_high) - measured_s
    u, kept = u_high, 0
    if abs(err_high) > tolerance:
        for _ in range(FIT_MAX_REPLAYS):
            u = (u_low * err_high - u_high * err_low) / (err_high - err_low)
            if not u_low < u < u_high:
                u = 0.5 * (u_low + u_high)
            err = thread_s(1.0 / u) - measured_s
            if abs(err) <= tolerance:
                break
            if err > 0:
                u_high, err_high = u, err
                err_low, kept = (err_low / 2.0 if kept == 1 else err_low), 1
            else:
                u_low, err_low = u, err
                err_high, kept = (err_high / 2.0 if kept == -1 else err_high), -1
        else:
            u = u_high if thread_s(1.0 / u_high) - measured_s < measured_s - thread_s(1.0 / u_low) else u_low
    fitted = 1.0 / u
    without_term = thread_s(fitted, io_contention=0.0)
    beside = thread_s(fitted * FLOP_FREE_RATE_FACTOR, io_contention=0.0)
    return fitted, without_term - beside, beside, thread_s(fitted) - without_term
