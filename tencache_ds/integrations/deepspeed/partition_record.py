"""What the parameter swapper knows of a partition beyond the store's entry: one record per partition, in one dict
(param_swapper.py). Owns: the record, the states of a read of ours as DeepSpeed sees it, and their invariants
against DeepSpeed's view of the partition (``ds_tensor.status``). The bytes, buffers and files are the store's
(cache/tensor_store.py)."""
import dataclasses
import enum
import weakref
from typing import Any, Dict, List, Tuple

from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus


class Read(enum.Enum):
    """Where the partition is in a read of ours. A read ahead is not announced to DeepSpeed (NOT_AVAILABLE), so its
    wait-for-all synchronize_reads never waits for a read needed much later."""

    NONE = "none"                # no read of ours is pending for DeepSpeed or for the schedule
    AHEAD = "ahead"              # started by the prefetch schedule, not asked for (DeepSpeed sees NOT_AVAILABLE)
    ASKED = "asked"              # swap_in marked it INFLIGHT: synchronize_reads waits for it
    ASKED_AHEAD = "asked_ahead"  # asked for while read ahead: that read is waited for, and fed back if late

    @property
    def asked(self) -> bool:
        return self in (Read.ASKED, Read.ASKED_AHEAD)


@dataclasses.dataclass
class PartitionRecord:
    """One partition the swapper has seen (zero.Init's write, or a swap-in)."""

    param: weakref.ref    # DeepSpeed's parameter, weakly: the swapper outlives a model it served
    read: Read = Read.NONE
    waiter: Any = None    # the parameter, held while DeepSpeed waits for its read (read.asked)
    asked_order: int = 0  # synchronize_reads waits in this order: the profile records each use as it is waited for

    def ask(self, param, ahead: bool, order: int) -> None:
        """DeepSpeed asked for the partition (swap_in): it is INFLIGHT until synchronize_reads."""
        self.read, self.waiter, self.asked_order = (Read.ASKED_AHEAD if ahead else Read.ASKED), param, order

    def settle(self) -> None:
        """No read of ours is pending any more (waited for, released, or handed over)."""
        self.read, self.waiter = Read.NONE, None


def record_of(records: Dict[Any, PartitionRecord], param) -> PartitionRecord:
    """``param``'s record, made on first sight; it names this parameter object from now on."""
    record = records.get(param.ds_id)
    if record is None:
        record = records[param.ds_id] = PartitionRecord(weakref.ref(param))
    elif record.param() is not param:
        record.param = weakref.ref(param)
    return record


def asked_in_order(records: Dict[Any, PartitionRecord]) -> List[Tuple[Any, PartitionRecord]]:
    """The partitions DeepSpeed asked for and waits for, as (ds_id, record), in the order it asked."""
    return sorted(((key, record) for key, record in records.items() if record.read.asked),
                  key=lambda item: item[1].asked_order)


def check_records(records: Dict[Any, PartitionRecord]) -> None:
    """The records agree with themselves and with DeepSpeed's view of each partition: a partition asked for is held
    and INFLIGHT, one read ahead is NOT_AVAILABLE (so DeepSpeed does not wait for it), no other holds its
    parameter, and asks have distinct orders. Raises AssertionError naming the partition."""
    orders = [record.asked_order for record in records.values() if record.read.asked]
    assert len(set(orders)) == len(orders), f"two partitions asked at the same order: {sorted(orders)}"
    for key, record in records.items():
        param = record.param()
        assert param is None or param.ds_id == key, f"partition {key}: its record names param {param.ds_id}"
        assert (record.waiter is not None) == record.read.asked, \
            f"partition {key}: read {record.read.value} but waiter {record.waiter!r}"
        status = None if param is None else param.ds_tensor.status
        if record.read.asked:
            assert record.waiter is param, f"partition {key}: waited for through another parameter object"
            assert status == PartitionedParamStatus.INFLIGHT, f"partition {key}: asked for but {status}"
        elif record.read is Read.AHEAD and param is not None:
            assert status == PartitionedParamStatus.NOT_AVAILABLE, f"partition {key}: read ahead but {status}"


__all__ = ["Read", "PartitionRecord", "record_of", "asked_in_order", "check_records"]
