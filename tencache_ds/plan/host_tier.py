"""Who gets the host tier's bytes. Owns: splitting one host budget between parameter partitions and optimizer
state by the NVMe I/O each held byte saves per training step. Pure.

Per step, with write-back, a parameter partition held in host memory saves a read in forward, a read in backward
and the write of its new weights after the optimizer step: 3 bytes of NVMe traffic per byte held. An optimizer
tensor (fp32 master, Adam moments, gradient) saves one read and one write: 2 bytes per byte held. So the tier
fills with parameter partitions first, optimizer state next; within a kind, the cache's own eviction (Belady over
the profiled order) decides which entries stay.
"""
import dataclasses
from typing import Dict, Sequence

PARAM_IO_BYTES_PER_HELD_BYTE = 3.0
OPTIMIZER_IO_BYTES_PER_HELD_BYTE = 2.0


def tensors_per_update(state_tensors: int) -> int:
    """The tensors one sub-group's update holds at once, whatever their dtype: its master, the optimizer's
    ``state_tensors`` (Adam's two moments, Adagrad's one) and its gradient."""
    return 1 + state_tensors + 1


# Adam's: the master, two moments and the gradient
OPTIMIZER_TENSORS_PER_SUB_GROUP = tensors_per_update(2)
# The optimizer's streaming slots (the largest sub-group's size each) at least; DeepSpeed's offload_optimizer
# buffer_count where larger. An update beyond them waits for a write that frees one.
OPTIMIZER_STREAMING_SLOTS = 8


def streaming_tensors_at_once(reads_ahead: bool, writes_behind: bool) -> int:
    """The optimizer tensors an update holds in streaming slots at once, as planned: a sub-group's master, moments
    and gradient; the next sub-group's too when it is read ahead; the last one's master and moments when it is
    written behind (a released changed tensor keeps its slot until its write ends). Adam's tensors whatever the
    optimizer: with fewer (Adagrad's one state tensor) the writes behind take the slots left (an Adagrad run held 7
    of 8: tests/deepspeed/test_parity.py). An estimate, not a bound: one too many where the gradient comes from
    stage 3's buffer (not read ahead), too few on a drive slow enough to keep writes of several sub-groups in
    flight (then up to every slot there is)."""
    per_update = OPTIMIZER_TENSORS_PER_SUB_GROUP
    return per_update * (2 if reads_ahead else 1) + (per_update - 1 if writes_behind else 0)


# fp32 master + 2 Adam moments + fp32 gradient, per parameter element (the optimizer's demand, estimated before
# the optimizer exists: its sub-groups hold exactly the partitioned parameters)
OPTIMIZER_BYTES_PER_ELEMENT = OPTIMIZER_TENSORS_PER_SUB_GROUP * 4


@dataclasses.dataclass(frozen=True)
class TierDemand:
    """``nbytes`` held would serve every access of ``name`` from host memory; each byte saves
    ``io_bytes_per_held_byte`` of NVMe traffic per step."""

    name: str
    nbytes: int
    io_bytes_per_held_byte: float


def split_host_budget(total_bytes: int, demands: Sequence[TierDemand]) -> Dict[str, int]:
    """Bytes per demand: greedy by I/O saved per byte (optimal for this fractional knapsack), ties in the given
    order. E.g. 100 MB for params (60 MB, 3/byte) and optimizer (480 MB, 2/byte): {params: 60, optimizer: 40}."""
    left = max(0, int(total_bytes))
    shares = {demand.name: 0 for demand in demands}
    for demand in sorted(demands, key=lambda d: -d.io_bytes_per_held_byte):
        shares[demand.name] = min(left, max(0, int(demand.nbytes)))
        left -= shares[demand.name]
    return shares
