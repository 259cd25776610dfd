"""The bound on tencache's step time. Owns: the NVMe path's measured rates (NvmeBandwidth), the least compute a step
needs (least_compute), the least NVMe bytes a tencache run's budgets allow per step (run_least_bytes: its profile
through plan/least_bytes.py) and the Bound that combines them. Does not own: measuring the drive
(io/drive_rate.py, run by cli/bench.py), the arithmetic of the least bytes (plan/least_bytes.py) or the per-step
series (bench/report_runs.py). Pure."""
import dataclasses
import os
from typing import Any, Dict, Optional, Sequence, Tuple

from ..plan.least_bytes import OPTIMIZER, PARAMS, LeastBytes, least_bytes
from ..profile.step_profile import StepProfile
from ..profile.store import read_sections
from ..units import fmt_bytes
from .report_runs import BenchRun, Value, is_number


def _param_budget(stats: Dict[str, Any], step: StepProfile) -> Optional[int]:
    """What the parameter store could hold from one use of a partition to the next: its arena's committed slots,
    streaming slots included, where it keeps copies (made with a host cache: any slot may keep one). Where it keeps
    none (``param_keeps_copies`` 0: made without one, streaming for good), only partitions held lent between uses,
    which the device tier does at one rank on a host accelerator within ``host_param_capacity`` (its committed slots
    when they take every partition of the step, ``step``, else nothing): counting the slots as room there gave
    gpt2-small's streaming bench a least 0.7 GiB below what any run of it moves (1.22x). A record from before the
    stat: the slots."""
    if not is_number(stats.get("param_reserved_bytes")):
        return None
    committed = stats["param_reserved_bytes"] - stats.get("param_retired_bytes", 0)
    if stats.get("param_keeps_copies") != 0:
        return committed
    every_partition = sum(dict(zip(step.keys, step.nbytes)).values())
    return committed if committed >= every_partition else 0


# A store's budget in the run's stats and its profile (the largest after any measured step, warm-up steps left out as
# they are from the bytes the bound is compared with: a larger budget gives fewer bytes, so the bound stays below what
# the run could do): the optimizer's share of the host tier, and what the parameter store could hold (_param_budget).
BUDGET_OF = {OPTIMIZER: lambda stats, _step: stats.get("optimizer_cache_budget_bytes"), PARAMS: _param_budget}
# the count of fp32 masters a run filled from its parameter partitions instead of reading them (master_copies.py),
# and the bytes those fills took in the optimizer store (its running totals)
MASTERS_FROM_PARTITIONS = "optimizer_masters_from_partitions"
COPIED_BYTES = "optimizer_cache_copied_bytes"
MASTER_BYTES_FROM_PARTITION_FILES = "optimizer_master_bytes_read_from_partition_files"


@dataclasses.dataclass(frozen=True)
class NvmeBandwidth:
    """The NVMe path's rates in bytes per second: measured by the bench through tencache's own engine
    (io/drive_rate.py: the fastest of reads, writes and both at once), or given with --nvme-bandwidth (then every
    rate is that one). ``combined_bytes_per_s``: reads and writes together; None: they share the drive (the time
    is the sum of both directions'). ``source`` says where the rates come from, for the report."""

    read_bytes_per_s: float
    write_bytes_per_s: float
    source: str
    combined_bytes_per_s: Optional[float] = None

    def least_seconds(self, read_bytes: float, write_bytes: float) -> float:
        """The least time the drive needs for these bytes: no faster than each direction alone, nor than all of them
        at the combined rate (or, without one, the two directions one after the other)."""
        read_s, write_s = read_bytes / self.read_bytes_per_s, write_bytes / self.write_bytes_per_s
        if self.combined_bytes_per_s is None:
            return read_s + write_s
        return max(read_s, write_s, (read_bytes + write_bytes) / self.combined_bytes_per_s)

    def speeds(self) -> str:
        both = (f", both at once {self.combined_bytes_per_s / 1e9:.2f} GB/s"
                if self.combined_bytes_per_s not in (None, self.read_bytes_per_s) else "")
        if self.read_bytes_per_s == self.write_bytes_per_s:
            return f"{self.read_bytes_per_s / 1e9:.2f} GB/s{both}"
        return f"read {self.read_bytes_per_s / 1e9:.2f} GB/s, write {self.write_bytes_per_s / 1e9:.2f} GB/s{both}"

    def describe(self) -> str:
        return f"{self.speeds()} ({self.source})"


@dataclasses.dataclass(frozen=True)
class Bound:
    """The I/O-compute bound on tencache's step time: the larger of ``compute_s``, the least time the step's work
    takes without waiting for NVMe (the smaller of stock CPU offload's step, the same work with no NVMe at all, and
    tencache's own step less the time it was blocked on NVMe; ``compute_source`` says which), and ``io_s``, the least
    time the drive needs for the least bytes tencache's budgets allow per step (``read_bytes``/``write_bytes``,
    from the run's profile: run_least_bytes) at its measured rates (None without either; ``io_missing`` says
    why). A step cannot beat either part, so ``step time / bound`` near 1 means nothing is left to win on this
    machine, and a step below it means the bound is wrong."""

    compute_s: Optional[float]
    io_s: Optional[float]
    bandwidth: Optional[NvmeBandwidth]
    read_bytes: Optional[float] = None
    write_bytes: Optional[float] = None
    compute_source: str = "the stock-cpu step"
    io_missing: str = "tencache's bytes per step are unknown"
    # ranks whose bytes the one drive moves: ``read_bytes``/``write_bytes`` are one rank's (rank 0's profile), and
    # every rank of a bench swaps under the same --nvme-path
    ranks_per_drive: int = 1

    @property
    def seconds(self) -> Optional[float]:
        # No NVMe bytes and no compute arm bound nothing: "0 s" would read as a bound the step cannot reach.
        parts = [part for part in (self.compute_s, self.io_s) if part is not None and part > 0]
        return max(parts) if parts else None

    @property
    def limited_by(self) -> Optional[str]:
        if self.seconds is None:
            return None
        return "NVMe" if self.io_s is not None and self.io_s >= (self.compute_s or 0.0) else "compute"

    def describe(self) -> str:
        """One line: the bound and its two parts, or why it is missing (bench.md names the bandwidth's source)."""
        parts = [f"compute {self.compute_s:.3f} s ({self.compute_source})" if self.compute_s is not None
                 else "compute: unknown (run with --compare cpu)"]
        if self.io_s is not None:
            ranks = "" if self.ranks_per_drive == 1 else f" and rank, x {self.ranks_per_drive} ranks on the drive,"
            parts.append(f"NVMe {self.io_s:.3f} s (the least {fmt_bytes(self.read_bytes or 0)} read + "
                         f"{fmt_bytes(self.write_bytes or 0)} written per step{ranks} at {self.bandwidth.speeds()})")
        elif self.bandwidth is None:
            parts.append("NVMe: no bandwidth (not measured; pass --nvme-bandwidth)")
        else:
            parts.append(f"NVMe: {self.io_missing}")
        if self.seconds is None:
            return "no bound: " + "; ".join(parts)
        return f"{self.seconds:.3f} s, limited by {self.limited_by}; " + "; ".join(parts)

    def to_dict(self) -> Dict[str, Any]:
        return {"seconds": self.seconds, "limited_by": self.limited_by, "compute_s": self.compute_s,
                "io_s": self.io_s, "read_bytes_per_step": self.read_bytes, "write_bytes_per_step": self.write_bytes,
                "ranks_per_drive": self.ranks_per_drive,
                "bandwidth": dataclasses.asdict(self.bandwidth) if self.bandwidth else None,
                "text": self.describe()}


def compute_bound(read_bytes: Optional[float], write_bytes: Optional[float], bandwidth: Optional[NvmeBandwidth],
                  compute_s: Optional[float], compute_source: str = "the stock-cpu step",
                  io_missing: str = "tencache's bytes per step are unknown", ranks_per_drive: int = 1) -> Bound:
    """The Bound for a step whose rank must move at least ``read_bytes``/``write_bytes``, ``ranks_per_drive`` ranks
    alike on one drive; e.g. 2 GB read + 1 GB written at 2 GB/s each, no combined rate -> io_s 1.5 s (3 s at 2
    ranks), and with a 1.2 s stock CPU offload step the bound is 1.5 s (NVMe-limited). ``io_missing``: why the
    bytes are None, for the report."""
    io_s = None
    ranks = max(1, int(ranks_per_drive))
    if bandwidth is not None and is_number(read_bytes) and is_number(write_bytes):
        io_s = bandwidth.least_seconds(read_bytes * ranks, write_bytes * ranks)
    return Bound(compute_s, io_s, bandwidth, read_bytes, write_bytes, compute_source, io_missing, ranks)


def least_compute(stock_cpu_steps: Sequence[Value], tencache_steps: Sequence[Tuple[Value, Value]]
                  ) -> Tuple[Optional[float], str]:
    """The least time the step's work takes with no NVMe wait, and where it comes from: the fastest of stock CPU
    offload's measured steps, or of tencache's measured steps less each one's own I/O wait (``tencache_steps``: (step
    time, fetch wait) of one step each), whichever is smaller (stock CPU offload has costs tencache avoids, such as
    gathering each parameter once per micro-batch), so that no measured step comes out below it. Until 2026-12-07
    it was the smaller of medians, which about half of the steps measured beat, and median step less median wait
    paired no step with its own wait (helper-205). A pair whose wait is not below its step (two threads' clocks)
    gives none."""
    candidates = [(float(step), "the stock-cpu step (fastest measured)") for step in stock_cpu_steps
                  if is_number(step)]
    candidates += [(float(step) - float(wait), "tencache's step less its NVMe wait (fastest measured)")
                   for step, wait in tencache_steps
                   if is_number(step) and is_number(wait) and float(step) > float(wait)]
    return min(candidates) if candidates else (None, "")


def _masters_filled(elsewhere: LeastBytes, read: LeastBytes, copied_per_step: Optional[int],
                    copied_from_memory_per_step: Optional[int] = None) -> LeastBytes:
    """The optimizer's least bytes where a run filled fp32 masters from its parameter partitions (master_copies.py)
    in its measured steps, some or all of them: ``elsewhere`` owes the drive no master's read nor write (the
    partitions hold what the update leaves: master_write_behind.py), a bound below any set of masters filled;
    ``read`` owes every one, and since keeping a tensor then saves no more than it can when some are filled,
    ``read`` less the most bytes a step filled (``copied_per_step``) for the writes, and less the most a step filled
    from partitions in host memory (``copied_from_memory_per_step``, default all of them) for the reads, is a bound
    too: a master filled from partitions on file is read all the same, from their files. The larger of the two,
    field by field (without the bytes per step, ``elsewhere``)."""
    if copied_per_step is None:
        return elsewhere
    from_memory = copied_per_step if copied_from_memory_per_step is None else copied_from_memory_per_step
    return dataclasses.replace(
        elsewhere, read_bytes=max(elsewhere.read_bytes, read.read_bytes - from_memory),
        write_bytes=max(elsewhere.write_bytes, read.write_bytes - copied_per_step),
        total_bytes=max(elsewhere.total_bytes, read.total_bytes - from_memory - copied_per_step),
        all_read_bytes=max(elsewhere.all_read_bytes, read.all_read_bytes - from_memory),
        all_write_bytes=max(elsewhere.all_write_bytes, read.all_write_bytes - copied_per_step))


def run_least_bytes(run: BenchRun, warmup_steps: int = 0) -> Tuple[Dict[str, LeastBytes], str]:
    """The least NVMe bytes per step of each store of a tencache run ({"params": ..., "optimizer": ...}, the stores
    its profile has) for the budgets its measured steps (after ``warmup_steps``) ran with, and where they come
    from, or ({}, why there are none). The profile is the file the bench named in the run's "tencache" block
    (rank 0's with several ranks); a store whose budget the stats do not give is left out. (An "auto" budget can
    change in the warm-up: the least for a budget the measured steps did not have bounds nothing they did.)"""
    block = (run.result.get("ds_config") or {}).get("tencache") or {}
    path = block.get("profile_path") if isinstance(block, dict) else None
    if not path:
        return {}, "the run saved no profile (no profile_path in its \"tencache\" block)"
    if (run.result.get("world_size") or 1) > 1:
        root, ext = os.path.splitext(path)
        path = f"{root}.rank0{ext}"
    try:
        sections = read_sections(path)
    except (OSError, ValueError) as err:
        return {}, f"its profile {path} is unreadable ({err})"
    measured = run.steps[warmup_steps:]
    if not measured:
        return {}, f"the run has no step after its {warmup_steps} warm-up steps"
    stats_rows = [step.get("stats") for step in measured if isinstance(step.get("stats"), dict)]
    filled = [stats.get(MASTERS_FROM_PARTITIONS) or 0 for stats in stats_rows]
    masters_in_partitions = bool(filled) and filled[-1] > (filled[0] if len(filled) > 1 else 0)
    copied = [stats.get(COPIED_BYTES) or 0 for stats in stats_rows]
    copied_per_step = max((after - before for before, after in zip(copied, copied[1:])), default=None)
    # ... of which read from the partitions' own files (those on file only): reads all the same
    from_files = [stats.get(MASTER_BYTES_FROM_PARTITION_FILES) or 0 for stats in stats_rows]
    from_memory_per_step = max((copied_after - copied_before - (files_after - files_before)
                                for copied_before, copied_after, files_before, files_after
                                in zip(copied, copied[1:], from_files, from_files[1:])), default=None)
    found = {}
    for store, saved in sections.items():
        budgets = [BUDGET_OF[store](stats, saved.step) for stats in stats_rows] if store in BUDGET_OF else []
        budgets = [budget for budget in budgets if is_number(budget)]
        if budgets:
            capacity = int(max(budgets))
            found[store] = least_bytes(saved.step, store, capacity)
            if masters_in_partitions and store == OPTIMIZER:
                found[store] = _masters_filled(least_bytes(saved.step, store, capacity, masters_in_partitions=True),
                                               found[store], copied_per_step, from_memory_per_step)
    if not found:
        return {}, f"its profile {path} has no store whose budget the stats give"
    return found, f"{os.path.basename(path)} through budgets of " + ", ".join(
        f"{store} {fmt_bytes(least.capacity_bytes)}" for store, least in sorted(found.items()))
