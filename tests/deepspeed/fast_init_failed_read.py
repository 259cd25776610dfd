"""offload_optimizer.fast_init builds each fp32 master straight from the parameter partitions' files
(``initialize_from_swapped_fp16_params``); a partition file that cannot be read (deleted here after zero.Init wrote
it) stops ``deepspeed.initialize`` with that file's error, and leaves no master lent: the swapper built so far closes
and gives its buffers back. Until 2026-12-03 the master being filled stayed lent, and closing the swapper stopped on
"cannot flush while tensors [...] are lent and changed". Real DeepSpeed, one rank, its CPU accelerator; prints OK or raises.
``python fast_init_failed_read.py PORT``"""
import gc
import glob
import os
import sys
import tempfile

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
sys.argv = [sys.argv[0], "none", "tencache", "nvme+params", "unused"]  # zero_scenarios.py reads its arguments
import tencache_ds  # noqa: E402,F401  (installs the swappers)
import deepspeed  # noqa: E402
import torch  # noqa: E402

import zero_scenarios as scenarios  # noqa: E402  (tests/deepspeed)
from tencache_ds.integrations.deepspeed.optimizer_swapper import TencacheOptimizerSwapper  # noqa: E402

deepspeed.init_distributed()
with tempfile.TemporaryDirectory() as nvme:
    config = scenarios.ds_config("0", "nvme+params", nvme, sub_group_size=scenarios.HIDDEN * scenarios.HIDDEN)
    config["zero_optimization"]["offload_optimizer"]["fast_init"] = True
    config["zero_optimization"]["offload_param"]["max_in_cpu"] = 0  # else stage 3 reads the files in first
    torch.manual_seed(1234)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = scenarios.Layers()
    partitions = sorted(glob.glob(os.path.join(nvme, "zero_stage_3", "*params", "rank0", "*.swp")))
    assert len(partitions) == 3, partitions  # the weights (the biases are below the size offloaded)
    victim = partitions[len(partitions) // 2]
    os.remove(victim)
    try:
        deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())
        raise AssertionError("initialize went on without a partition's file")
    except Exception as err:  # noqa: BLE001  (the file's own error, whatever its type)
        assert os.path.basename(victim) in str(err), repr(err)
        # the swapper built so far, which the error's frames hold: a notebook keeps its last traceback
        swappers = [obj for obj in gc.get_objects() if isinstance(obj, TencacheOptimizerSwapper)]
    assert len(swappers) == 1, swappers
    swapper = swappers[0]
    swapper.close()  # gives the buffers and I/O threads back (it stopped on the lent master before)
print("OK")
