"""A universal checkpoint (``ds_to_universal``'s output: one folder per parameter) loaded with the optimizer on NVMe.
Owns: writing its optimizer state into this engine's sub-groups (``load_state_from_universal``), or its weights
alone (``load_weights_from_universal``).

Why: a universal checkpoint is DeepSpeed's way to resume at another world size (ZeRO-3 refuses another world size's
own checkpoint). Stage 3 loads it in ``_load_universal_checkpoint``, which its engine calls from
``_load_zero_checkpoint``; with the optimizer on NVMe the engine skips that function (and looks for swap files,
which a universal checkpoint has none of: FileNotFoundError in stock), and stage 3's own code could not run there
anyway: it builds each sub-group's state ``zeros_like`` its master, an empty placeholder when swapped out. Here each
sub-group's master and Adam moments are assembled from the parameters' files, as stage 3 assembles them
(``load_hp_checkpoint_state``: this rank's partition of each parameter), and written into the sub-group a sub-group
at a time (zero_file.write_sub_groups); the step count, the groups' settings and the loss scaler as stage 3 sets
them. A checkpoint saved with the optimizer on NVMe becomes universal after ``tencache-ds checkpoint-for-cpu``
(``ds_to_universal`` reads the moments from the ZeRO files).
"""
import os

import torch
from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT

from ...errors import TencacheError
from ...log import logger
from .zero_file import write_sub_groups

STATE_KEYS = ("exp_avg", "exp_avg_sq")  # what ds_to_universal writes besides the fp32 weights (stage 3's loader's)


def load_state_from_universal(engine, tag_folder: str) -> None:
    """Load the universal checkpoint in ``tag_folder``: masters, moments, step count, groups' settings, loss scaler,
    into this engine's sub-groups (stage 3's ``load_hp_checkpoint_state_from_checkpoint_dir_stage3``)."""
    optimizer = engine.optimizer
    zero_folder = _zero_folder(tag_folder)
    optimizer_file = os.path.join(zero_folder, "optimizer_state.pt")
    if not os.path.isfile(optimizer_file):
        raise TencacheError(f"load_checkpoint of a universal checkpoint: {optimizer_file}, which holds its optimizer "
                            f"state's step and settings, does not exist; load the weights only: load_checkpoint(..., "
                            f"load_optimizer_states=False). Nothing was loaded.")
    saved = torch.load(optimizer_file, weights_only=False)
    optimizer._load_global_state_stage3(saved)
    step = saved[OPTIMIZER_STATE_DICT]["state"][0]["step"]
    write_sub_groups(optimizer, lambda sub_group_id, _master: (
        _assembled(optimizer, zero_folder, sub_group_id, "fp32"),
        dict({key: _assembled(optimizer, zero_folder, sub_group_id, key) for key in STATE_KEYS}, step=step)))
    for group in optimizer.optimizer.param_groups:  # the same settings for every group, as stage 3 sets them
        group.update({key: value for key, value in saved[OPTIMIZER_STATE_DICT]["param_groups"][0].items()
                      if key != "params"})
    logger.info("loaded the universal checkpoint in %s into %d sub-groups (optimizer on NVMe)", tag_folder,
                len(optimizer.fp32_partitioned_groups_flat))


def load_weights_from_universal(engine, tag_folder: str) -> None:
    """Load the universal checkpoint's weights alone (stage 3's
    ``load_module_checkpoint_state_from_checkpoint_dir_stage3``): the masters from its fp32 weights
    (``zero_optimization.load_from_fp32_weights``, the default), else from the 16-bit weights made of them."""
    optimizer = engine.optimizer
    zero_folder = _zero_folder(tag_folder)
    if engine.zero_load_from_fp32_weights():
        write_sub_groups(optimizer, lambda sub_group_id, _master: (
            _assembled(optimizer, zero_folder, sub_group_id, "fp32"), {}))
        return
    for sub_group_id, bit16 in enumerate(optimizer.fp16_partitioned_groups_flat):
        if bit16 is None:
            raise TencacheError(f"load_checkpoint(load_optimizer_states=False) of a universal checkpoint with "
                                f"zero_optimization.load_from_fp32_weights false sets the 16-bit partitions, and "
                                f"sub-group {sub_group_id}'s parameters are on NVMe beyond offload_param.max_in_cpu "
                                f"(stock stops too); raise max_in_cpu, or load_from_fp32_weights. Nothing was loaded.")
        bit16.data.copy_(_assembled(optimizer, zero_folder, sub_group_id, "fp32"))
    optimizer.refresh_fp32_params()  # checkpoint.refresh_masters_swapping_in


def _zero_folder(tag_folder: str) -> str:
    zero_folder = os.path.join(tag_folder, "zero")
    if not os.path.isdir(zero_folder):
        raise TencacheError(f"load_checkpoint of a universal checkpoint: {zero_folder} does not exist; is "
                            f"{tag_folder} ds_to_universal's output? Nothing was loaded.")
    return zero_folder


def _assembled(optimizer, zero_folder: str, sub_group_id: int, key: str) -> torch.Tensor:
    """Sub-group ``sub_group_id``'s flat partition of ``key`` ("fp32", "exp_avg", "exp_avg_sq"): each of its
    parameters' partition for this rank, in order, the rest zeros (the alignment's padding), as stage 3 builds it."""
    flat = torch.zeros(int(optimizer.fp16_partitioned_groups_flat_numel[sub_group_id]),
                       dtype=optimizer.fp32_partitioned_groups_flat[sub_group_id].dtype)
    offset = 0
    for param in optimizer.fp16_groups[sub_group_id]:
        if param not in optimizer.param_names:
            raise TencacheError(f"load_checkpoint of a universal checkpoint: a parameter of sub-group {sub_group_id} "
                                f"has no name (stage 3's param_names), so its folder under {zero_folder} is not known")
        part = optimizer.load_hp_checkpoint_state(os.path.join(zero_folder, optimizer.param_names[param]), key,
                                                  param=param)
        flat.narrow(0, offset, part.numel()).copy_(part)
        offset += part.numel()
    return flat
