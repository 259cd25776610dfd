"""Decisions every rank must make alike. Owns: the one collective that turns each rank's own readings into a
decision shared by all ranks (the element-wise minimum over ranks), and nothing else.

Why: DeepSpeed all-gathers only the parameters that are not already gathered, so which parameters the device tier
keeps decides which collectives run. Its budget comes from each rank's own readings (free device memory, the host
tier's share, memory pressure), which differ a little between ranks on any real machine: a rank that keeps a
parameter another released skips an all-gather the other joins, and gloo aborts ("Received data size doesn't
match expected size") where NCCL would hang or mix up data. Likewise a rank that stops for memory while the others
go on leaves them waiting in their next collective. So budgets are agreed (the smallest wins: it fits every rank)
and a stop anywhere is a stop everywhere, each at a point every rank passes in the same order.
"""
import os
from typing import Callable, List, Sequence, TypeVar

from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator

from ...errors import TencacheError

T = TypeVar("T")


def world_size() -> int:
    """Ranks in the job: 1 where torch.distributed is not (yet) initialized."""
    return dist.get_world_size() if dist.is_initialized() else 1


def agree_min(values: Sequence[int]) -> List[int]:
    """The element-wise minimum of ``values`` over all ranks (every rank passes the same number of values, at the
    same point of its run). One rank: ``values`` unchanged, no collective."""
    values = [int(value) for value in values]
    if world_size() <= 1:
        return values
    import torch  # a collective needs a tensor on the communication device (CPU for gloo, the GPU for NCCL)

    tensor = torch.tensor(values, dtype=torch.int64, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return [int(value) for value in tensor.tolist()]


def _collective_device() -> str:
    """This rank's device for a collective: the one of its LOCAL_RANK, as the engine sets it (engine.py
    ``_set_distributed_vars``). deepspeed.initialize's check agrees before the engine has set it, when every rank's
    current device is still the first: an NCCL all-reduce there would put two ranks on one GPU. The CPU
    accelerator's is "cpu" whatever the rank."""
    accelerator = get_accelerator()
    local = os.environ.get("LOCAL_RANK")
    if local is not None and local.isdigit() and accelerator.device_name() != "cpu" and \
            int(local) < accelerator.device_count():
        return accelerator.device_name(int(local))
    return accelerator.current_device_name()


def raised_on_every_rank(attempt: Callable[[], None], elsewhere: Callable[[], Exception]) -> None:
    """Run ``attempt``; where it raises on any rank, raise on every rank: its own error where it raised, else
    ``elsewhere()`` (which says that another rank stopped). Every rank must call this at the same point."""
    error = None
    try:
        attempt()
    except Exception as err:  # noqa: BLE001  (raised on every rank below, not on this one alone)
        error = err
    none_raised, = agree_min([error is None])
    if error is not None:
        raise error
    if not none_raised:
        raise elsewhere()


def built_on_every_rank(build: Callable[[], T], what: str) -> T:
    """``build()``'s result where it returned on every rank; where it raised on any rank, it raises on every rank
    (its own error there, elsewhere a TencacheError naming ``what``). The swappers are built at a point every rank
    passes (zero.Init, ZeRO-3's __init__), and a rank that stopped there alone (another run holding its swap folder,
    a stale build lock, a memlock limit of its node) left the others in the next collective, zero.Init's broadcast:
    waiting for it (NCCL, until its timeout), or stopped by gloo's "Connection reset by peer" once it exited, with
    nothing said of why (helper-195's review)."""
    built = []
    raised_on_every_rank(lambda: built.append(build()), lambda: TencacheError(
        f"another rank could not build its {what} (its error says why): stopped on every rank rather than leave "
        f"this one waiting for it"))
    return built[0]
