"""A resident parameter partition that stage 3 rewrites in place (``_partitioned_params_swap_out``, DeepSpeed's own
function as tencache installs it, on a sub-group whose partition is AVAILABLE), then released before any step ends,
as after a load's rebuild of the parameters (reset_swap_buffers: no step ends there): a swap-in after it reads the
new bytes. Until 2026-12-07 the partition was marked changed only at a step's end, so its release, with no host
cache, dropped it clean and the swap-in read the file's old bytes (helper-149's review). Runs the real swapper on
DeepSpeed's CPU accelerator; prints OK or raises."""
import sys
import types

import torch
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

from lone_swapper import Param, lone_swapper

swapper, _nvme = lone_swapper(sys.argv[1])
numel = 1 << 18
param = Param(11, numel)
param.nvme_swapper = swapper  # as zero.Init sets it
buffer = swapper.get_buffer(param, numel)
buffer.fill_(1.0)
param.ds_tensor.data = buffer.data
swapper.swap_out_and_release([param])

swapper.swap_in([param], async_op=False)  # resident (AVAILABLE): stage 3 copies into it in place
stage3 = types.SimpleNamespace(fp32_partitioned_groups_flat=[torch.full((numel,), 2.0)], fp16_groups=[[param]],
                               fp16_partitioned_groups=[[param.ds_tensor]])
DeepSpeedZeroOptimizer_Stage3._partitioned_params_swap_out(stage3, 0)
assert torch.all(param.ds_tensor.data == 2.0)
swapper.remove_partition_and_release_buffers([param])  # no step ended

swapper.swap_in([param], async_op=False)
assert torch.all(param.ds_tensor.data == 2.0), param.ds_tensor.data[:4]
swapper.remove_partition_and_release_buffers([param])

# The same where stage 3's swap-out of the sub-group's other partitions (on file) raises after the copy in place (a
# drive error; a caller that catches it and goes on): the resident one keeps its new bytes (helper-157's review).
other = Param(12, numel)
other.nvme_swapper = swapper
buffer = swapper.get_buffer(other, numel)
buffer.fill_(1.0)
other.ds_tensor.data = buffer.data
swapper.swap_out_and_release([other])
swapper.swap_in([param], async_op=False)
stage3 = types.SimpleNamespace(fp32_partitioned_groups_flat=[torch.full((2 * numel,), 3.0)],
                               fp16_groups=[[param, other]],
                               fp16_partitioned_groups=[[param.ds_tensor, other.ds_tensor]])


def drive_error(*args, **kwargs):
    raise OSError(5, "Input/output error")


swapper.swap_out_partitioned_params = drive_error
try:
    DeepSpeedZeroOptimizer_Stage3._partitioned_params_swap_out(stage3, 0)
    raise AssertionError("the swap-out's error was not raised")
except OSError:
    pass
del swapper.swap_out_partitioned_params
assert torch.all(param.ds_tensor.data == 3.0)
swapper.remove_partition_and_release_buffers([param])
swapper.swap_in([param], async_op=False)
assert torch.all(param.ds_tensor.data == 3.0), param.ds_tensor.data[:4]
swapper.remove_partition_and_release_buffers([param])
swapper.close()
print("OK")
