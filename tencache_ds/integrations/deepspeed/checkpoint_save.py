"""What a checkpoint saved under tencache holds, and how its swap files get there. Owns: the fp32 masters in the ZeRO
file, and the swap folder's files linked into (and out of) checkpoints instead of copied.

The masters. With the optimizer on NVMe, stage 3's ZeRO file (``zero_pp_rank_*_optim_states.pt``) saves each swapped
sub-group's fp32 master as the empty placeholder it is between steps; the bytes are only in the swap folder. So
``zero_to_fp32`` and ``load_state_dict_from_zero_checkpoint`` stop with "consumed N numels out of 0", and so does a
``load_checkpoint(load_optimizer_states=False)``, which reads the module's weights that way. Under tencache, the ZeRO
file gets every master: while the engine writes it, each placeholder shows its swap file's bytes, mapped (torch.save
reads them as it writes; nothing is copied into memory first). Stock's loader reads the file as before; the moments
stay in the swap files only (putting them in the ZeRO file too would write all the optimizer state at every save).
"""
import contextlib
import functools

import torch
from deepspeed.runtime.swap_tensor.optimizer_utils import OptimizerSwapper

from .optimizer_swapper import TencacheOptimizerSwapper


@contextlib.contextmanager
def masters_shown(optimizer):
    """While inside: each swapped-out fp32 master of a ZeRO-3 optimizer under tencache's optimizer swapper is its
    swap file's bytes (flushed first), mapped read-only; afterwards the placeholders are back."""
    swapper = getattr(optimizer, "optimizer_swapper", None)
    shown = []
    try:
        if isinstance(swapper, TencacheOptimizerSwapper):
            for master in optimizer.fp32_partitioned_groups_flat:
                info = swapper.swap_params_info.get(OptimizerSwapper.parameter_id(master))
                if info is None or master.numel() > 0:  # not swapped, or swapped in now
                    continue
                path = info.tensors[0].swap_path  # the master: the first tensor of its swap info
                if swapper.store.knows(path):
                    swapper.store.flush_key(path)
                master.data = torch.from_file(path, shared=False, size=info.numel(), dtype=master.dtype)
                shown.append(master)
        yield
    finally:
        for master in shown:
            master.data = torch.Tensor()  # stock's placeholder (optimizer_utils SwapTensorContext.release_memory)


def saving_masters(save_zero_checkpoint):
    """engine._save_zero_checkpoint with the swapped masters in the file it writes."""
    @functools.wraps(save_zero_checkpoint)
    def save_zero_checkpoint_with_masters(self, *args, **kwargs):
        with masters_shown(self.optimizer):
            return save_zero_checkpoint(self, *args, **kwargs)

    return save_zero_checkpoint_with_masters
