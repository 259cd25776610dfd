"""An update whose give-back of a sub-group is refused as its writes start (its swap files linked into a checkpoint
must get files of their own first, and the swap folder takes no change of its names: here made immutable; a full
disk refuses the copy a partial write makes the same way): the step stops with that error, every tensor of the
sub-group goes back to the store anyway (the refused ones DIRTY, their bytes held), and ``engine.destroy()`` closes
the swapper. Until 2026-12-02 the tensors
after the refused one stayed lent, recorded nowhere, and the close stopped on "cannot forget tensor ...: it is lent"
(the streaming slots' arena never closed). Real engine, one rank, DeepSpeed's CPU accelerator, a folder on a file
system that takes ``chattr +i`` (prints SKIP otherwise); prints OK or raises. ``python optimizer_refused_write.py PORT
FOLDER``"""
import glob
import os
import subprocess
import sys
import tempfile

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
work = sys.argv[2]
sys.argv = [sys.argv[0], "none", "tencache", "nvme", "unused"]  # zero_scenarios.py reads its arguments
import tencache_ds  # noqa: E402,F401  (installs the swappers; DeepSpeed is imported already where forked)
import deepspeed  # noqa: E402

import zero_scenarios as scenarios  # noqa: E402  (tests/deepspeed)
from tencache_ds.cache.entry import LENT, EntryState  # noqa: E402


def immutable(folder, on):
    try:
        return subprocess.run(["chattr", "+i" if on else "-i", folder], capture_output=True).returncode == 0
    except OSError:  # no chattr here
        return False


deepspeed.init_distributed()
with tempfile.TemporaryDirectory(dir=work) as nvme, tempfile.TemporaryDirectory(dir=work) as checkpoints:
    config = scenarios.ds_config("0", "nvme", nvme, sub_group_size=scenarios.HIDDEN * scenarios.HIDDEN)
    data = list(scenarios.batches(2))
    folder = os.path.join(nvme, "zero_stage_3", "optimizer", "rank0")
    with scenarios.engine_for(config) as engine:
        scenarios.trained(engine, data[:1])
        engine.save_checkpoint(checkpoints, tag="saved")  # the swap files are linked into it (same file system)
        if not immutable(folder, True):
            print("SKIP: chattr +i is refused here")
            sys.exit(0)
        try:
            scenarios.trained(engine, data[1:])
            raise AssertionError("the update wrote to the swap files linked into the checkpoint without a copy")
        except PermissionError:
            pass
        finally:
            immutable(folder, False)
        store = engine.optimizer.optimizer_swapper.store
        known = [path for path in glob.glob(os.path.join(folder, "*.swp")) if store.knows(path)]
        # the refusal was a give-back's: a write refused, its entry DIRTY with its bytes held
        assert store.stats()["write_errors"] >= 1, store.stats()
        assert any(store.state(path) == EntryState.DIRTY for path in known), [store.state(p) for p in known]
        lent = [path for path in known if store.state(path) in LENT]
        assert not lent, lent
    # (the engine's destroy at the with's end closed the swapper: it raised "lent" here before)
print("OK")
