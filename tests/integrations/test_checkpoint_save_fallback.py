"""The ZeRO file written through DeepSpeed's own TorchCheckpointEngine while the masters share the swap files' blocks
(integrations/deepspeed/checkpoint_save.py, ``_saving_by_shared_blocks``): where the sharing save fails, the engine's
usual save makes the file, with a warning that names the cause, and the engine's own method is back afterwards."""
import logging
import os
import types

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

from tencache_ds.integrations.deepspeed.checkpoint_save import _saving_by_shared_blocks
from tencache_ds.integrations.deepspeed.optimizer_swapper import CheckpointTotals


def test_a_sharing_save_that_fails_falls_back_to_the_engines_own_save(tmp_path):
    master = torch.randn(10_000)
    engine = TorchCheckpointEngine()
    swapper = types.SimpleNamespace(last_zero_file_save="untouched", checkpoint_totals=CheckpointTotals())
    missing = {master.untyped_storage().data_ptr(): str(tmp_path / "gone.swp")}  # its swap file cannot be read
    path = str(tmp_path / "tag" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger("tencache_ds").addHandler(handler)  # the package logger does not propagate (log.py)
    try:
        with _saving_by_shared_blocks(engine, missing, swapper):
            engine.save({"fp32_flat_groups": [master]}, path)
    finally:
        logging.getLogger("tencache_ds").removeHandler(handler)
    assert torch.equal(torch.load(path, weights_only=False)["fp32_flat_groups"][0], master)
    assert swapper.last_zero_file_save is None
    assert swapper.checkpoint_totals == CheckpointTotals(zero_files_not_shared=1)  # counted in the swapper's stats
    assert any("written the usual way (masters not shared): FileNotFoundError" in record.getMessage()
               for record in records)
    assert "save" not in vars(engine) and os.listdir(os.path.dirname(path)) == [os.path.basename(path)]
