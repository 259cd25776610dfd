"""A parameter partition whose read fails: synchronize_reads raises the I/O error, the partition is NOT_AVAILABLE
(not left INFLIGHT), a second synchronize_reads has nothing to report, and once the file is back a swap-in
reads the right bytes. Runs the real swapper on DeepSpeed's CPU accelerator; prints OK or raises."""
import shutil
import sys

import torch
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus

from lone_swapper import Param, lone_swapper
from tencache_ds.errors import StaleFileError

swapper, _nvme = lone_swapper(sys.argv[1])

param = Param(7, 1 << 19)
buffer = swapper.get_buffer(param, 1 << 19)
buffer.copy_(torch.arange(1 << 19, dtype=torch.float32))
param.ds_tensor.data = buffer.data
swapper.swap_out_and_release([param])
path = swapper.get_path(param)
shutil.move(path, path + ".away")
swapper.swap_in([param], async_op=True)
try:
    swapper.synchronize_reads()
    raise AssertionError("a failed read was not reported")
except StaleFileError:
    pass
assert param.ds_tensor.status == PartitionedParamStatus.NOT_AVAILABLE, param.ds_tensor.status
swapper.synchronize_reads()  # nothing in flight: no stale "no read in flight" error
shutil.move(path + ".away", path)
swapper.swap_in([param], async_op=False)
assert torch.equal(param.ds_tensor.data, torch.arange(1 << 19, dtype=torch.float32))
swapper.remove_partition_and_release_buffers([param])
swapper.close()
print("OK")
