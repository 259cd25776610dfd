"""An update that stops on a missing optimizer swap file (a state's file deleted under a run streaming everything):
the error the run stops on is the missing file's, also after ``engine.destroy()`` closes the swapper, which gave
"cannot forget tensor ...: it is lent" instead until 2026-11-27 (the sub-group's entries stayed lent), and leaves none
of the sub-group's reads started ahead in flight. Real engine,
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
from tencache_ds.cache.entry import EntryState  # noqa: E402
from tencache_ds.errors import StaleFileError  # noqa: E402
from tencache_ds.integrations.deepspeed.swap_files import SWAP_FILE_NAME  # noqa: E402


def sub_group_of(path):
    """The sub-group id of a master's or state's swap file; None for any other file (a gradient's)."""
    match = SWAP_FILE_NAME.match(os.path.basename(path))
    return None if match is None else match["id"]


deepspeed.init_distributed()
with tempfile.TemporaryDirectory() as nvme:
    config = scenarios.ds_config("0", "nvme+params", nvme, sub_group_size=scenarios.HIDDEN * scenarios.HIDDEN)
    data = list(scenarios.batches(3))
    try:
        with scenarios.engine_for(config) as engine:
            scenarios.trained(engine, data[:1])
            victim = sorted(glob.glob(os.path.join(nvme, "zero_stage_3", "optimizer", "rank0", "exp_avg-*.swp")))[0]
            os.remove(victim)
            try:
                scenarios.trained(engine, data[1:])
            except StaleFileError:
                # the sub-group's other reads started ahead are given back, not left READING (until 2026-12-02 they
                # were: a swap-in of it again stopped on "already lent or being read"); a later sub-group's are
                # still ReadsAhead's
                store, group = engine.optimizer.optimizer_swapper.store, sub_group_of(victim)
                files = glob.glob(os.path.join(os.path.dirname(victim), "*.swp"))
                reading = [path for path in files if sub_group_of(path) == group and
                           store.state(path) == EntryState.READING]
                assert not reading, reading
                raise
        raise AssertionError("training went on without a state's file")
    except StaleFileError as err:
        assert victim in str(err), err
print("OK")
