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
import copy
import os

import torch
from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT, PARAM

from ...errors import TencacheError
from ...log import logger
from .swap_files import LOAD_REFUSED
from .zero_file import load_mapped, write_sub_groups

STATE_KEYS = ("exp_avg", "exp_avg_sq")  # what ds_to_universal writes besides the fp32 weights (stage 3's loader's)


def load_state_from_universal(engine, tag_folder: str) -> None:
    """Load the universal checkpoint in ``tag_folder``: masters, moments, step count, groups' settings, loss scaler,
    into this engine's sub-groups (stage 3's ``load_hp_checkpoint_state_from_checkpoint_dir_stage3``)."""
    optimizer = engine.optimizer
    zero_folder = _checked(optimizer, tag_folder, ("fp32",) + STATE_KEYS)
    optimizer_file = os.path.join(zero_folder, "optimizer_state.pt")
    if not os.path.isfile(optimizer_file):
        raise TencacheError(f"load_checkpoint of a universal checkpoint: {optimizer_file}, which holds its optimizer "
                            f"state's step and settings, does not exist; load the weights only: load_checkpoint(..., "
                            f"load_optimizer_states=False). {LOAD_REFUSED}")
    # ds_to_universal's copy of a saved rank's whole stage 3 state dict: mapped, only its scalars are read
    stage3 = load_mapped(optimizer_file)
    try:
        step = stage3[OPTIMIZER_STATE_DICT]["state"][0]["step"]
        settings = stage3[OPTIMIZER_STATE_DICT]["param_groups"][0]
    except (KeyError, IndexError) as err:
        raise TencacheError(f"load_checkpoint of a universal checkpoint: {optimizer_file} has no step count or "
                            f"parameter group ({err!r}). {LOAD_REFUSED}") from None
    optimizer._load_global_state_stage3(stage3)  # the loss scaler
    write_sub_groups(optimizer, lambda sub_group_id, _master: (
        _assembled(optimizer, zero_folder, sub_group_id, "fp32"),
        dict({key: _assembled(optimizer, zero_folder, sub_group_id, key) for key in STATE_KEYS}, step=step)))
    for group in optimizer.optimizer.param_groups:  # the same settings for every group, as stage 3 sets them
        group.update({key: copy.deepcopy(value) for key, value in settings.items() if key != "params"})
    logger.info("loaded the universal checkpoint in %s into %d sub-groups (optimizer on NVMe)", tag_folder,
                len(optimizer.fp32_partitioned_groups_flat))


def load_weights_from_universal(engine, tag_folder: str) -> None:
    """Load the universal checkpoint's weights alone (stage 3's
    ``load_module_checkpoint_state_from_checkpoint_dir_stage3``): the masters from its fp32 weights
    (``zero_optimization.load_from_fp32_weights``, the default), else from the 16-bit weights made of them."""
    optimizer = engine.optimizer
    zero_folder = _checked(optimizer, tag_folder, ("fp32",))
    if engine.zero_load_from_fp32_weights():
        write_sub_groups(optimizer, lambda sub_group_id, _master: (
            _assembled(optimizer, zero_folder, sub_group_id, "fp32"), {}))
        return
    on_file = [sub_group_id for sub_group_id, bit16 in enumerate(optimizer.fp16_partitioned_groups_flat)
               if bit16 is None]
    if on_file:
        raise TencacheError(f"load_checkpoint(load_optimizer_states=False) of a universal checkpoint with "
                            f"zero_optimization.load_from_fp32_weights false sets the 16-bit partitions, and the "
                            f"parameters of sub-groups {on_file} are on NVMe beyond offload_param.max_in_cpu (stock "
                            f"stops too); raise max_in_cpu, or set load_from_fp32_weights. {LOAD_REFUSED}")
    for sub_group_id, bit16 in enumerate(optimizer.fp16_partitioned_groups_flat):
        bit16.data.copy_(_assembled(optimizer, zero_folder, sub_group_id, "fp32"))
    optimizer.refresh_fp32_params()  # checkpoint.refresh_masters_swapping_in


def _checked(optimizer, tag_folder: str, keys) -> str:
    """The checkpoint's ``zero`` folder, once every parameter of every sub-group has a name and a file of each of
    ``keys`` there: a load that stopped half way would leave some sub-groups loaded and some not."""
    zero_folder = os.path.join(tag_folder, "zero")
    if not os.path.isdir(zero_folder):
        raise TencacheError(f"load_checkpoint of a universal checkpoint: {zero_folder} does not exist; is "
                            f"{tag_folder} ds_to_universal's output? {LOAD_REFUSED}")
    for sub_group_id, params in enumerate(optimizer.fp16_groups):
        for param in params:
            if param not in optimizer.param_names:
                raise TencacheError(f"load_checkpoint of a universal checkpoint: a parameter of sub-group "
                                    f"{sub_group_id} has no name (the engine's param_names), so its folder under "
                                    f"{zero_folder} is not known. {LOAD_REFUSED}")
            for key in keys:
                path = os.path.join(zero_folder, optimizer.param_names[param], f"{key}.pt")
                if not os.path.isfile(path):
                    raise TencacheError(f"load_checkpoint of a universal checkpoint: {path} does not exist (was "
                                        f"the model changed since ds_to_universal?). {LOAD_REFUSED}")
                if key in STATE_KEYS and _without_bytes(path):
                    raise TencacheError(
                        f"load_checkpoint of a universal checkpoint: {path} holds no bytes: ds_to_universal converted "
                        f"a checkpoint saved under tencache with the optimizer on NVMe, whose moments are in its "
                        f"swap files; run `tencache-ds checkpoint-for-cpu` on that checkpoint, then ds_to_universal "
                        f"again. {LOAD_REFUSED}")
    return zero_folder


def _without_bytes(path: str) -> bool:
    """Is the tensor a universal checkpoint's file holds a meta tensor (read mapped: its bytes are not read)?"""
    saved = load_mapped(path)
    tensor = saved.get(PARAM) if isinstance(saved, dict) else saved
    return torch.is_tensor(tensor) and tensor.is_meta


def _assembled(optimizer, zero_folder: str, sub_group_id: int, key: str) -> torch.Tensor:
    """Sub-group ``sub_group_id``'s flat partition of ``key`` ("fp32", "exp_avg", "exp_avg_sq"): each of its
    parameters' partition for this rank, in order, the rest zeros (the alignment's padding), as stage 3 builds it."""
    # the masters' dtype (bf16 with bf16_master_weights_and_grads): a swapped-out master is an empty fp32 placeholder
    flat = torch.zeros(int(optimizer.fp16_partitioned_groups_flat_numel[sub_group_id]),
                       dtype=optimizer.master_weights_and_grads_dtype)
    offset = 0
    for param in optimizer.fp16_groups[sub_group_id]:
        folder = os.path.join(zero_folder, optimizer.param_names[param])
        part = optimizer.load_hp_checkpoint_state(folder, key, param=param)
        flat.narrow(0, offset, part.numel()).copy_(part)
        offset += part.numel()
    return flat
