"""An update that stops on a missing optimizer swap file (a state's file deleted under a run streaming everything):
the error the run stops on is the missing file's, also after ``engine.destroy()`` closes the swapper, which gave
"cannot forget tensor ...: it is lent" instead until 2026-11-27 (the sub-group's entries stayed lent). Real engine,
one rank, DeepSpeed's CPU accelerator; prints OK or raises. ``python optimizer_missing_file.py PORT``"""
import glob
import os
import sys
import tempfile

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
sys.argv = [sys.argv[0], "none", "tencache", "nvme+params", "unused"]  # zero_scenarios.py reads its arguments
import tencache_ds  # noqa: E402,F401  (installs the swappers; DeepSpeed is imported already where forked)
import deepspeed  # noqa: E402

import zero_scenarios as scenarios  # noqa: E402  (tests/deepspeed)
from tencache_ds.errors import StaleFileError  # noqa: E402

deepspeed.init_distributed()
with tempfile.TemporaryDirectory() as nvme:
    config = scenarios.ds_config("0", "nvme+params", nvme, sub_group_size=scenarios.HIDDEN * scenarios.HIDDEN)
    data = list(scenarios.batches(3))
    try:
        with scenarios.engine_for(config) as engine:
            scenarios.trained(engine, data[:1])
            victim = sorted(glob.glob(os.path.join(nvme, "zero_stage_3", "optimizer", "rank0", "exp_avg-*.swp")))[0]
            os.remove(victim)
            scenarios.trained(engine, data[1:])
        raise AssertionError("training went on without a state's file")
    except StaleFileError as err:
        assert victim in str(err), err
print("OK")
