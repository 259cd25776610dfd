"""A parameter partition whose read fails: synchronize_reads raises the I/O error, the partition is NOT_AVAILABLE
(not left INFLIGHT), a second synchronize_reads has nothing to report, and once the file is back a swap-in
reads the right bytes. Runs the real swapper on DeepSpeed's CPU accelerator; prints OK or raises."""
import os
import shutil
import sys
import tempfile

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=sys.argv[1])
import torch  # noqa: E402
import deepspeed  # noqa: E402
import tencache_ds  # noqa: E402,F401
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus  # noqa: E402
from tencache_ds.errors import StaleFileError  # noqa: E402
from tencache_ds.integrations.deepspeed.param_swapper import TencacheParamSwapper  # noqa: E402

deepspeed.init_distributed(dist_backend="gloo")
nvme = tempfile.mkdtemp()
config = DeepSpeedConfig({"train_batch_size": 1, "zero_optimization": {
    "stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme, "max_in_cpu": 0},
    "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}, "tencache": {"host_cache_bytes": 0}})
swapper = TencacheParamSwapper(config, torch.float32)


class Param:
    def __init__(self, ds_id, numel):
        self.ds_id = ds_id
        self.ds_tensor = torch.empty(0)
        self.ds_tensor.ds_numel = numel
        self.ds_tensor.status = PartitionedParamStatus.AVAILABLE


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
