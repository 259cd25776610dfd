"""A TencacheParamSwapper on its own, for the scenario scripts beside this file (failed_read.py,
partition_records.py): one rank on DeepSpeed's CPU accelerator, a fresh NVMe folder, no host cache, and stand-in
parameters that carry only what the swapper reads (ds_id, ds_tensor with ds_numel and status)."""
import atexit
import os
import shutil
import tempfile

import torch
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus


def lone_swapper(port: str, **env):
    """A swapper over a fresh folder (returned too); ``env`` is set before it is built (e.g. its debug checks)."""
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=port, **env)
    import deepspeed
    import tencache_ds  # noqa: F401  # installs the swappers
    from deepspeed.runtime.config import DeepSpeedConfig
    from tencache_ds.integrations.deepspeed.param_swapper import TencacheParamSwapper

    deepspeed.init_distributed(dist_backend="gloo")
    nvme = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, nvme, True)  # (left behind, 5 MiB a run: about 120 such folders in /tmp)
    config = DeepSpeedConfig({"train_batch_size": 1, "zero_optimization": {
        "stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme, "max_in_cpu": 0},
        "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}, "tencache": {"host_cache_bytes": 0}})
    return TencacheParamSwapper(config, torch.float32), nvme


class Param:
    """What the swapper reads of a ZeRO-3 parameter; AVAILABLE (just partitioned) until zero.Init writes it."""

    def __init__(self, ds_id, numel):
        self.ds_id = ds_id
        self.ds_tensor = torch.empty(0)
        self.ds_tensor.ds_numel = numel
        self.ds_tensor.status = PartitionedParamStatus.AVAILABLE
