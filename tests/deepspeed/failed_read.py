"""A parameter partition whose read fails: synchronize_reads raises the I/O error, the partition is NOT_AVAILABLE
(not left INFLIGHT), a second synchronize_reads has nothing to report, and once the file is back a swap-in
reads the right bytes. Then a wait for its read interrupted (Ctrl-C, as the signal lands while the read is in
flight): the interrupt reaches the caller, and a swap-in after it reads the right bytes (until 2026-12-06 the read,
ended but unapplied, left the partition "already lent or being read" for good: helper-140's review). Runs the real
swapper on DeepSpeed's CPU accelerator; prints OK or raises."""
import concurrent.futures
import shutil
import sys

import torch
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus

from lone_swapper import Param, lone_swapper
from tencache_ds.cache import transfers
from tencache_ds.errors import StaleFileError

swapper, _nvme = lone_swapper(sys.argv[1])

param = Param(7, 1 << 19)
buffer = swapper.get_buffer(param, 1 << 19)
buffer.copy_(torch.arange(1 << 19, dtype=torch.float32))
param.ds_tensor.data = buffer.data
swapper.swap_out_and_release([param])
path = swapper.get_path(param)


def read_stops_on(error, why: str) -> None:
    """A swap-in whose wait for the read stops on ``error`` leaves the partition NOT_AVAILABLE (not INFLIGHT)."""
    swapper.swap_in([param], async_op=True)
    try:
        swapper.synchronize_reads()
        raise AssertionError(why)
    except error:
        pass
    assert param.ds_tensor.status == PartitionedParamStatus.NOT_AVAILABLE, param.ds_tensor.status


def reads_the_right_bytes() -> None:
    swapper.swap_in([param], async_op=False)
    assert torch.equal(param.ds_tensor.data, torch.arange(1 << 19, dtype=torch.float32))
    swapper.remove_partition_and_release_buffers([param])


shutil.move(path, path + ".away")
read_stops_on(StaleFileError, "a failed read was not reported")
swapper.synchronize_reads()  # nothing in flight: no stale "no read in flight" error
shutil.move(path + ".away", path)
reads_the_right_bytes()

waited = transfers._wait_quietly


def interrupted(future):
    """What the wait does when Ctrl-C lands in it: waits for the I/O to end (it still uses its buffer), re-raises."""
    concurrent.futures.wait([future])
    raise KeyboardInterrupt


transfers._wait_quietly = interrupted
try:
    read_stops_on(KeyboardInterrupt, "the interrupt was swallowed")
finally:
    transfers._wait_quietly = waited
reads_the_right_bytes()

# A partition asked for (its read in flight) whose read fails, then rewritten whole by the update before anyone waits
# (stage 3's swap_out_partitioned_params): the failed read's bytes are never needed, the new ones are written, and
# a swap-in reads them. Until 2026-12-07 the read's error stopped the update with the partition INFLIGHT and no
# record of it (helper-149's review).
with open(path, "r+b") as handle:
    saved = handle.read()
    handle.truncate(0)  # the read fails: the file is short
swapper.swap_in([param], async_op=True)
new = torch.full((1 << 19,), 5.0)
swapper.swap_out_partitioned_params([param], [new])
assert param.ds_tensor.status == PartitionedParamStatus.NOT_AVAILABLE, param.ds_tensor.status
swapper.swap_in([param], async_op=False)
assert torch.equal(param.ds_tensor.data, new)
swapper.remove_partition_and_release_buffers([param])
swapper.close()
print("OK")
