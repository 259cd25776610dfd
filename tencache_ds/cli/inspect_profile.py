"""`tencache-ds profile show` and `tencache-ds plan`: a saved profile, read back for people. Owns: turning the
profile file (profile/store.py) and the planners (plan/host_tier.py, plan/host_residency.py, plan/prefetch.py)
into text or JSON. Does not own: any of the numbers (the planners compute them) or the file format.

    tencache-ds profile show runs/profile.json [--first 10] [--json]
    tencache-ds plan runs/profile.json [--host-cache-bytes 8GiB] [--read-bandwidth 3GB/s]
                                       [--in-flight-bytes 1GiB] [--first 10] [--json]

No torch, no DeepSpeed: it runs anywhere the profile file can be copied to.
"""
import datetime
import json
import statistics
import sys
from typing import Dict, List, Optional

from ..plan.host_tier import (OPTIMIZER_IO_BYTES_PER_HELD_BYTE, PARAM_IO_BYTES_PER_HELD_BYTE, TierDemand,
                              split_host_budget)
from ..plan.prefetch import PrefetchSchedule
from ..plan.host_residency import steady_state
from ..plan.size_classes import size_histogram
from ..profile.step_profile import StepProfile
from ..profile.store import SavedSection, read_sections, section_kind
from ..units import fmt_bytes

READ_TIME_SOURCES = {"given": "from --read-bandwidth", "measured": "as measured",
                     "other sections": "at the other sections' measured bandwidth"}
# NVMe bytes per step that one held byte saves, per section (plan/host_tier.py); another section: one read
IO_BYTES_PER_HELD_BYTE = {"params": PARAM_IO_BYTES_PER_HELD_BYTE, "optimizer": OPTIMIZER_IO_BYTES_PER_HELD_BYTE}


def _read(path: str) -> Optional[Dict[str, SavedSection]]:
    try:
        sections = read_sections(path)
    except (OSError, ValueError) as err:
        print(f"tencache-ds: cannot read profile {path}: {err}", file=sys.stderr)
        return None
    if not sections:  # (an empty report and exit 0 said nothing of why: helper-244)
        print(f"tencache-ds: profile {path} holds no section: no run has saved its profile into it yet",
              file=sys.stderr)
        return None
    return sections


def _emit(args, report: dict, lines: List[str]) -> None:
    print(json.dumps(report, indent=2, default=str) if args.json else "\n".join(lines))


# ------------------------------------------------------------------------------------------------ profile show
def show(args) -> int:
    sections = _read(args.path)
    if sections is None:
        return 1
    report = {"path": args.path, "sections": {}}
    lines = [f"profile {args.path}"]
    for name, saved in sections.items():
        summary = summarize(saved, args.first)
        report["sections"][name] = summary
        lines += [""] + _summary_lines(name, summary)
    _emit(args, report, lines)
    return 0


def summarize(saved: SavedSection, first: int) -> dict:
    """One section's sequence, sizes and timings, JSON-able."""
    step = saved.step
    sizes = step.tensor_nbytes()
    reads = sum(1 for seconds in step.read_s if seconds is not None)
    return {
        "fingerprint": saved.fingerprint, "facts": saved.facts,
        "recorded": _when(saved.recorded_unix),
        "accesses": len(step), "distinct_keys": len(sizes), "first_keys": list(step.keys[:first]),
        "size_histogram": {str(size): count for size, count in sorted(size_histogram(sizes.values()).items())},
        "tensor_bytes": sum(sizes.values()),
        "step_s": step.step_s, "compute_s": step.compute_s, "io_wait_s": step.total_stall_s,
        "reads": reads, "read_bytes": step.read_bytes, "read_s": step.measured_read_s,
        "read_bytes_per_s": step.measured_read_bytes_per_s, "accessed_bytes": step.accessed_bytes,
        "steady": saved.steady.to_json() if saved.steady is not None else None,
    }


def _summary_lines(name: str, summary: dict) -> List[str]:
    facts = " ".join(f"{key}={value}" for key, value in sorted(summary["facts"].items()))
    histogram = ", ".join(f"{fmt_bytes(int(size))} x {count}" for size, count in summary["size_histogram"].items())
    bandwidth = summary["read_bytes_per_s"]
    return [
        f"[{name}] recorded {summary['recorded']}, fingerprint {summary['fingerprint']}",
        f"  facts      {facts or '-'}",
        f"  sequence   {summary['accesses']} accesses, {summary['distinct_keys']} distinct tensors; first "
        f"{len(summary['first_keys'])}: {_keys(summary['first_keys'])}",
        f"  sizes      {histogram or '-'} (page-rounded; {fmt_bytes(summary['tensor_bytes'])} in all)",
        f"  timings    step {summary['step_s']:.4f} s = compute {summary['compute_s']:.4f} s + I/O wait "
        f"{summary['io_wait_s']:.4f} s",
        f"  reads      {summary['reads']} of {summary['accesses']} accesses read NVMe: "
        f"{fmt_bytes(summary['read_bytes'])} in {summary['read_s']:.4f} s of read times"
        + (f" ({fmt_bytes(bandwidth)}/s a read: reads in flight together overlap, so not the drive's rate)"
           if bandwidth else ""),
        f"  bytes      {fmt_bytes(summary['accessed_bytes'])} accessed per step, {fmt_bytes(summary['read_bytes'])} "
        f"read",
        _steady_line(summary["steady"]),
    ]


def _steady_line(steady: Optional[dict]) -> str:
    if steady is None:
        return "  repeats    none timed (the timings above are the recorded step's, the run's first)"
    return (f"  repeats    median of {steady['steps']} timed: step {steady['step_s']:.4f} s = compute "
            f"{steady['compute_s']:.4f} s + I/O wait {steady['stall_s']:.4f} s; {steady['reads']} reads, "
            f"{fmt_bytes(steady['read_bytes'])} in {steady['read_s']:.4f} s")


# ------------------------------------------------------------------------------------------------------- plan
def plan(args) -> int:
    sections = _read(args.path)
    if sections is None:
        return 1
    steps = {name: saved.step for name, saved in sections.items()}
    shares = split_host_budget(args.host_cache_bytes, [
        TierDemand(name, sum(step.tensor_nbytes().values()), IO_BYTES_PER_HELD_BYTE.get(section_kind(name), 1.0))
        for name, step in steps.items()])
    report = {"path": args.path, "host_cache_bytes": args.host_cache_bytes, "read_bytes_per_s": args.read_bandwidth,
              "in_flight_budget_bytes": args.in_flight_bytes, "host_tier_split": shares, "sections": {}}
    bandwidth = "measured per section" if args.read_bandwidth is None else f"{fmt_bytes(args.read_bandwidth)}/s"
    in_flight = "unbounded" if args.in_flight_bytes is None else fmt_bytes(args.in_flight_bytes)
    lines = [f"plan for {args.path}: host tier {fmt_bytes(args.host_cache_bytes)}, read bandwidth {bandwidth}, "
             f"reads in flight {in_flight}",
             "host tier split (by NVMe bytes saved per byte held): "
             + ", ".join(f"{name} {fmt_bytes(share)}" for name, share in shares.items())]
    failed = False
    # the sections' files share a device: a section that measured no read borrows the others' bandwidth
    pooled = _pooled_read_bytes_per_s(steps.values())
    for name, step in steps.items():
        bandwidth, source = args.read_bandwidth, "given"
        if bandwidth is None:
            measured = step.measured_read_bytes_per_s is not None
            bandwidth, source = (None, "measured") if measured or pooled is None else (pooled, "other sections")
        try:
            section = plan_section(step, shares[name], bandwidth, args.in_flight_bytes, args.first,
                                   optimizer=section_kind(name) == "optimizer")
        except ValueError as err:  # no bandwidth to plan with
            section = {"error": f"{err}: pass --read-bandwidth"}
            failed = True
        section["bandwidth_source"] = source
        if source != "given" and "io_bound_s" in section:
            # a bound only from a drive's rate: measured read times overlap (reads in flight together), and their
            # sum exceeded the very step they were recorded in (helper-186's review)
            section["io_bound_s"] = None
        elif "io_bound_s" in section and len(steps) > 1:
            # each store's recorder takes out its own waits only: this section's compute holds the others' (the
            # update's reads in the parameters'), so it bounds nothing; its reads at the drive's rate do
            # (helper-199's review)
            section["io_bound_s"], section["io_bound_of"] = section["read_s"], "reads"
        report["sections"][name] = section
        lines += [""] + _plan_lines(name, section)
    _emit(args, report, lines)
    return 1 if failed else 0


def _pooled_read_bytes_per_s(steps) -> Optional[float]:
    """All sections' measured reads together: bytes over seconds (None if none was measured)."""
    seconds = sum(step.measured_read_s for step in steps)
    return sum(step.read_bytes for step in steps) / seconds if seconds > 0 else None


def plan_section(step: StepProfile, host_bytes: int, read_bytes_per_s: Optional[float],
                 in_flight_bytes: Optional[int], first: int, optimizer: bool = False) -> dict:
    """The host tier's steady state and the prefetch schedule for one section, JSON-able. ``optimizer``: the
    section's store holds prefixes in the room whole tensors leave, and its reads ahead are not scheduled from the
    profile (the run reads the next sub-groups' state while the update runs: cache/optimizer_reads_ahead.py), so no
    leads are reported for it; a parameter section's are planned as the run plans them, each read within the step
    that uses it (param_swapper: ``within_step``; helper-234: the leads printed reached into the previous step)."""
    sizes = step.tensor_nbytes()
    residency = steady_state(step.keys, sizes, host_bytes, prefixes=optimizer)
    schedule = PrefetchSchedule.from_profile(step, read_bytes_per_s, in_flight_bytes, reads_at=residency.misses,
                                             within_step=not optimizer)
    held = [key for key in dict.fromkeys(step.keys) if key in residency.held]  # in first-use order
    prefetched = [position for position in sorted(residency.misses) if schedule.leads[position]]
    leads = [schedule.leads[position] for position in prefetched]
    scheduled = {
        "prefetched_reads": len(prefetched), "demand_reads": len(residency.misses) - len(prefetched),
        "lead_min": min(leads, default=0), "lead_median": statistics.median(leads) if leads else 0,
        "lead_max": max(leads, default=0),
        "first_leads": [[position, schedule.leads[position]] for position in sorted(residency.misses)][:first],
        "tail_reads": list(schedule.tail_reads)}
    return {
        "accesses": len(step), "tensors": len(sizes), "tensor_bytes": sum(sizes.values()),
        "host_bytes": host_bytes, "held_tensors": len(held), "held_bytes": sum(sizes[key] for key in held),
        "first_held_keys": held[:first], "prefix_bytes": sum(residency.prefixes.values()),
        "reads": len(residency.misses), "read_bytes": residency.read_bytes(step.nbytes, step.keys),
        **{key: None if optimizer else value for key, value in scheduled.items()},
        "compute_s": schedule.compute_s, "read_s": schedule.read_s,
        "io_bound_s": schedule.io_bound_s,
        "predicted_step_s": schedule.predicted_step_s,
    }


def _plan_lines(name: str, section: dict) -> List[str]:
    if "error" in section:
        return [f"[{name}] cannot plan: {section['error']}"]
    leads = ", ".join(f"{position}:{lead}" for position, lead in section["first_leads"] or ())
    return [
        f"[{name}] {section['accesses']} accesses of {section['tensors']} tensors "
        f"({fmt_bytes(section['tensor_bytes'])}); host tier share {fmt_bytes(section['host_bytes'])}",
        f"  held       {section['held_tensors']} of {section['tensors']} tensors ({fmt_bytes(section['held_bytes'])})"
        f" stay in host memory: {_keys(section['first_held_keys'])}"
        + (f"; {fmt_bytes(section['prefix_bytes'])} of prefixes" if section["prefix_bytes"] else ""),
        f"  reads      {section['reads']} of {section['accesses']} accesses read NVMe, "
        f"{fmt_bytes(section['read_bytes'])} per step" + (
            "" if section["prefetched_reads"] is None else
            f"; {section['prefetched_reads']} prefetched, {section['demand_reads']} on demand"),
        "  leads      none planned: the run reads the next sub-groups' state ahead while the update runs"
        if section["prefetched_reads"] is None else
        f"  leads      accesses ahead: min {section['lead_min']}, median {section['lead_median']}, max "
        f"{section['lead_max']}; position:lead {leads or '-'}" + (
            f"; started in the previous step's update: positions {_keys(section['tail_reads'])}"
            if section["tail_reads"] else ""),
        f"  step       predicted {section['predicted_step_s']:.4f} s; " + (
            f"I/O bound {section['io_bound_s']:.4f} s (its reads at the given rate; its compute, "
            f"{section['compute_s']:.4f} s, holds the other sections' waits: no part of a bound)"
            if section.get("io_bound_of") == "reads" else
            f"I/O bound {section['io_bound_s']:.4f} s (compute {section['compute_s']:.4f} s, reads "
            f"{section['read_s']:.4f} s; read times {READ_TIME_SOURCES[section['bandwidth_source']]})"
            if section["io_bound_s"] is not None else
            f"compute {section['compute_s']:.4f} s, reads one after another {section['read_s']:.4f} s (read times "
            f"{READ_TIME_SOURCES[section['bandwidth_source']]}, which overlap in a run: no bound; "
            f"--read-bandwidth gives one)"),
    ]


def _keys(keys) -> str:
    return " ".join(str(key) for key in keys) or "-"


def _when(unix: Optional[float]) -> str:
    if unix is None:
        return "(unknown time)"
    return datetime.datetime.fromtimestamp(unix).strftime("%Y-%m-%d %H:%M:%S")
