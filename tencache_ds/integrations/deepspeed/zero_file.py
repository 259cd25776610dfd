"""A checkpoint's ZeRO file (``zero_pp_rank_*_optim_states.pt``: stage 3's state dict of one rank) as a load with the
optimizer on NVMe reads it. Owns: reading this rank's file (``load_zero_state``), the parameter groups' settings
restored from it (``restore_group_settings``), and the optimizer's state of a checkpoint saved with the optimizer on
cpu written into this engine's swap files (``load_state_from_zero_file``).

Why the last: a user whose run outgrew host memory moves ``offload_optimizer`` from cpu to NVMe and resumes. That
checkpoint has no ``offloaded_tensors/``: its ZeRO file holds the fp32 masters (``fp32_flat_groups``) and the
torch optimizer's state dict (Adam's moments and step counts, the groups' settings). DeepSpeed's load with the
optimizer on NVMe reads swap files only (stock stops with FileNotFoundError); stock CPU offload loads the ZeRO file
(stage 3's ``_rigid_load_state_dict``: the optimizer's state dict by torch's rules, the masters copied, the 16-bit
partitions set from them). Here the same values reach the swap files, one sub-group at a time, as a step moves them:
swapped in, set, swapped out. The file is mapped, so the state of a model whose state does not fit in memory is never
all in memory at once.
"""
import copy
import itertools
import os
from typing import Callable, List, Optional, Tuple

import torch
from deepspeed.checkpoint.constants import FP32_FLAT_GROUPS, LOSS_SCALER, OPTIMIZER_STATE_DICT

from ...errors import TencacheError
from ...log import logger
from .swap_files import LOAD_REFUSED


def load_zero_state(engine, tag_folder: str):
    """(path, stage 3's state dict) of this rank's ZeRO file in the checkpoint's folder ``tag_folder``
    (``<load_dir>/<tag>``). Memory-mapped: its tensors (the fp32 masters checkpoint_save.py puts there, a cpu-offload
    run's moments) are read only where used."""
    zero_file = _zero_file_name(engine, tag_folder)
    saved = load_mapped(zero_file, lambda path: engine.checkpoint_engine.load(path, map_location="cpu"))
    return zero_file, saved.get(OPTIMIZER_STATE_DICT) or {}


def load_mapped(path: str, read_all: Optional[Callable] = None):
    """``torch.load`` of ``path`` memory-mapped: its tensors are read only where used. A file that cannot be mapped
    (not a zip file: an old torch format, or another checkpoint engine's) is read whole, by ``read_all(path)``
    (default: ``torch.load``)."""
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except RuntimeError:
        if read_all is not None:
            return read_all(path)
        return torch.load(path, map_location="cpu", weights_only=False)


def live_param_groups(optimizer) -> List[list]:
    """The torch optimizer's parameter groups of a ZeRO-3 optimizer, each its list of fp32 masters (one a sub-group;
    stage 3 empties the groups between steps)."""
    optimizer._set_fp32_optimizer_param_groups()
    try:
        return [list(group["params"]) for group in optimizer.optimizer.param_groups]
    finally:
        optimizer._clear_fp32_optimizer_param_groups()


def holds_no_bytes(value) -> bool:
    """Is ``value``, a state tensor saved in a ZeRO file, a stand-in for one whose bytes are in swap files? Stage 3
    saves a swapped-out state tensor as an empty placeholder; tencache's save as a meta tensor of its size
    (checkpoint_save.swapped_state_described)."""
    return torch.is_tensor(value) and (value.is_meta or (value.dim() > 0 and value.numel() == 0))


def _zero_file_name(engine, tag_folder: str) -> str:
    """This rank's ZeRO file in ``tag_folder``: the name the engine gives it, else the names stock's loader also tries
    (the other 16-bit prefix: a checkpoint of another precision; the older ``optim_states.pt`` spelling)."""
    name = engine._get_zero_ckpt_name(os.path.dirname(tag_folder), os.path.basename(tag_folder))
    folder, base = os.path.split(name)
    other_precision = base[len("bf16_"):] if base.startswith("bf16_") else "bf16_" + base
    for candidate in (base, other_precision, base.replace("_optim_states.pt", "optim_states.pt"),
                      other_precision.replace("_optim_states.pt", "optim_states.pt")):
        if os.path.exists(os.path.join(folder, candidate)):
            return os.path.join(folder, candidate)
    raise TencacheError(f"load_checkpoint: the checkpoint has no ZeRO file for this rank: {name} does not exist")


def live_by_saved_id(saved_groups, live_groups: List[list]) -> dict:
    """{saved parameter id: live parameter}, for the ZeRO file's torch optimizer ``param_groups`` and the live
    groups' parameter lists: torch's own rule (``Optimizer.load_state_dict``) pairs them in group order."""
    return dict(zip(itertools.chain.from_iterable(group["params"] for group in saved_groups),
                    itertools.chain.from_iterable(live_groups)))


def restore_group_settings(live_groups, saved_groups, zero_file) -> int:
    """Each parameter group's settings as saved (``lr``, ``betas``, ``weight_decay``, ...: everything but its
    parameters), as torch's ``Optimizer.load_state_dict`` does for stock CPU offload. The learning rate is the one
    that matters: an lr scheduler's ``load_state_dict`` restores its counters, not the groups' ``lr``, which it sets
    only at its next ``step()``, after the first resumed update; so that update ran at the fresh scheduler's first
    value (0 in a warm-up: Hugging Face's Trainer, resumed, differed from its uninterrupted run from there on).
    Returns how many settings were restored."""
    if len(live_groups) != len(saved_groups):
        logger.warning("the checkpoint in %s has %d optimizer parameter groups, this engine %d: their learning "
                       "rates and settings are not restored (as in stock DeepSpeed's NVMe load)", zero_file,
                       len(saved_groups), len(live_groups))
        return 0
    restored = 0
    for live, saved in zip(live_groups, saved_groups):
        for key, value in saved.items():
            if key != "params":  # a copy, as torch's: a tensor would point into the memory-mapped ZeRO file
                live[key] = copy.deepcopy(value)
                restored += 1
    return restored


def load_state_from_zero_file(engine, tag_folder: str, swap_source: str) -> int:
    """Write the optimizer's state saved in this rank's ZeRO file of the checkpoint in ``tag_folder`` (saved with the
    optimizer on cpu) into this engine's sub-groups: masters, moments and step counts, group settings, the loss
    scaler, as stock CPU offload's load sets them. Raises before anything is set when the file's sub-groups are not
    this engine's, or hold their state without its bytes (a checkpoint of the optimizer on NVMe whose swap files are
    not in ``swap_source``). Returns the number of sub-groups set. The engine rebuilds the parameters from the
    masters after (``reset_swap_buffers``). A sub-group the file has no state for (saved before its first step)
    starts Adam over (``start_adam_over``), as torch's load does."""
    optimizer = engine.optimizer
    zero_file, zero_state = load_zero_state(engine, tag_folder)
    saved_masters, saved = zero_state.get(FP32_FLAT_GROUPS), zero_state.get(OPTIMIZER_STATE_DICT)
    if saved_masters is None or not saved or "state" not in saved:
        raise TencacheError(f"load_checkpoint: {zero_file} holds no optimizer state (no fp32_flat_groups or "
                            f"optimizer_state_dict), and the checkpoint has no optimizer swap files either; load the "
                            f"weights only: load_checkpoint(..., load_optimizer_states=False). {LOAD_REFUSED}")
    groups = live_param_groups(optimizer)
    state_of = {id(master): saved["state"].get(saved_id, {})
                for saved_id, master in live_by_saved_id(saved["param_groups"], groups).items()}
    _check_bytes(zero_file, swap_source, saved_masters,
                 [state_of.get(id(master), {}) for master in optimizer.fp32_partitioned_groups_flat])
    # the masters' own sizes: a swapped-out master is an empty placeholder
    _check_layout(zero_file, saved_masters, saved["param_groups"], optimizer.fp16_partitioned_groups_flat_numel,
                  groups)
    restore_loss_scaling(optimizer, zero_state)
    restore_group_settings(optimizer.optimizer.param_groups, saved["param_groups"], zero_file)
    write_sub_groups(optimizer, lambda sub_group_id, master: (
        saved_masters[sub_group_id], state_of[id(master)]))
    start_adam_over(optimizer, [master for master in optimizer.fp32_partitioned_groups_flat
                                if not state_of.get(id(master))])
    logger.info("loaded the optimizer state of %d sub-groups from %s (saved with the optimizer on cpu) into the "
                "swap files", len(saved_masters), zero_file)
    return len(saved_masters)


def restore_loss_scaling(optimizer, zero_state: dict) -> None:
    """Set on the live stage 3 ``optimizer`` the loss scaler's state its ZeRO file holds (the scaler, with its
    current scale; whether it is dynamic; the last overflow), as stage 3's own load does (``_rigid_load_state_dict``,
    which stock's NVMe load never calls: an fp16 run's dynamic scale restarted there at its initial power)."""
    optimizer.loss_scaler = zero_state[LOSS_SCALER]
    optimizer.dynamic_loss_scale = zero_state["dynamic_loss_scale"]
    optimizer.overflow = zero_state["overflow"]


def start_adam_over(optimizer, masters) -> int:
    """The sub-groups of ``masters`` (fp32 masters of a ZeRO-3 optimizer under tencache's optimizer swapper) whose
    loaded checkpoint holds no optimizer state (saved before their first step): Adam starts over there, as torch's
    ``load_state_dict`` of that state does (stock CPU offload's load), whatever this engine trained: the live state
    emptied, its swapped tensors no longer registered or held (the next step makes them anew). Returns how many
    state entries and tensors went."""
    base, forgotten = optimizer.optimizer, 0
    for master in masters:
        if base.state.get(master):
            base.state[master] = {}
            forgotten += 1 + optimizer.optimizer_swapper.forget_state_tensors(master)
    return forgotten


def write_sub_groups(optimizer, values_of: Callable) -> None:
    """Set each sub-group's fp32 master and optimizer state to ``values_of(sub_group_id, master)``: (the master's
    values or None to leave it, {state key: value}), a sub-group at a time, as a step moves them: swapped in (or in
    memory), set, swapped out. Keys it does not give keep the live state."""
    base, timer_names = optimizer.optimizer, set()
    for sub_group_id, master in enumerate(optimizer.fp32_partitioned_groups_flat):
        optimizer._prepare_sub_group(sub_group_id, timer_names)  # the master and moments swapped in (or in memory)
        try:
            values, state = values_of(sub_group_id, master)
            if values is not None:
                master.data.copy_(values)
            live = base.state[master]
            for key, value in state.items():
                if not (torch.is_tensor(value) and value.dim() > 0):
                    live[key] = copy.deepcopy(value)  # the step count
                elif key in live and live[key].shape == value.shape:
                    live[key].data.copy_(value)
                else:  # a state tensor this engine has not made yet: the swap-out stores it
                    live[key] = value.to(dtype=master.dtype, copy=True)
        finally:  # the swapped-in buffers go back whatever happened
            optimizer._release_sub_group(sub_group_id, timer_names)


def _check_bytes(zero_file, swap_source, saved_masters, saved_states) -> None:
    """Raise unless the file holds every master and state tensor it names with its bytes, each of its master's size:
    a checkpoint saved with the optimizer on NVMe (stock's or tencache's) describes them without bytes, and its
    bytes are in swap files that are not where the load looked."""
    for sub_group_id, (master, state) in enumerate(zip(saved_masters, saved_states)):
        described = [key for key, value in state.items() if holds_no_bytes(value) or (
            torch.is_tensor(value) and value.dim() > 0 and value.numel() != master.numel())]
        missing = (["fp32 master"] if master.is_meta or master.numel() == 0 else []) + [
            f"optimizer state {key}" for key in described]
        if missing:
            raise TencacheError(
                f"load_checkpoint: the checkpoint's ZeRO file {zero_file} holds sub-group {sub_group_id}'s "
                f"{', '.join(missing)} without its bytes: "
                f"it was saved with the optimizer on NVMe, and its swap files are not in {swap_source}. Copy the "
                f"checkpoint whole (offloaded_tensors/ with it), or load the weights only: load_checkpoint(..., "
                f"load_optimizer_states=False). {LOAD_REFUSED}")


def _check_layout(zero_file, saved_masters, saved_groups, numels, groups: List[list]) -> None:
    """Raise unless the saved sub-groups are this engine's: as many, each of its size, in parameter groups of the
    same lengths (torch's load stops on the last: "a parameter group that doesn't match the size")."""
    mismatch = None
    if len(saved_masters) != len(numels):
        mismatch = f"{len(saved_masters)} optimizer sub-groups, this engine {len(numels)}"
    elif [len(group["params"]) for group in saved_groups] != [len(group) for group in groups]:
        mismatch = (f"parameter groups of {[len(group['params']) for group in saved_groups]} sub-groups, this "
                    f"engine's of {[len(group) for group in groups]}")
    else:
        sizes: List[Tuple[int, int]] = [(saved.numel(), int(numel)) for saved, numel in zip(saved_masters, numels)]
        wrong = next((i for i, (saved, live) in enumerate(sizes) if saved != live), None)
        if wrong is not None:
            mismatch = f"sub-group {wrong} of {sizes[wrong][0]} elements, this engine's of {sizes[wrong][1]}"
    if mismatch is not None:
        raise TencacheError(
            f"load_checkpoint: the checkpoint's ZeRO file {zero_file} (saved with the optimizer on cpu) has "
            f"{mismatch}: its optimizer state cannot be loaded into this engine's sub-groups (stock CPU offload stops "
            f"too). Did zero_optimization.sub_group_size, the model or its frozen parameters change since the save? "
            f"Load with those as they were, or load the weights only: load_checkpoint(..., "
            f"load_optimizer_states=False). {LOAD_REFUSED}")
