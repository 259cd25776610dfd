"""Exact resume with the optimizer on NVMe. Owns: restoring the optimizer state that stock DeepSpeed's NVMe load
path skips — Adam's step counts, and the registration of the moments whose bytes the swap folder holds — from
the checkpoint it already wrote.

Why stock's resume is not exact (DeepSpeed 0.19.8, engine.py ``load_checkpoint``): with ``offload_optimizer``
on NVMe the engine does not call ``_load_zero_checkpoint`` (the ZeRO optimizer's state dict is not loaded); it
copies ``offloaded_tensors/`` over the swap folder instead. The folder holds tensors only (fp32 masters, Adam's
moments), and the optimizer's ``state`` dict, which the checkpoint saves (the ZeRO file's
``optimizer_state_dict``), is not loaded. In a fresh engine that dict is empty (Adam creates its state at the
first step), so the first resumed update starts Adam over: step count 0 and zero moments, which then overwrite the
loaded moment files. In a continued engine the step count is the engine's own. Either way the first resumed loss
is right (computed before that update) and the next is not. With the optimizer on ``cpu`` the state dict is
loaded and resume is exact.

Every copy of optimizer state the host tier holds when the engine copies the checkpoint over the swap folder is
dropped before its next use (loading_checkpoint), whatever the files' timestamps say. After the engine's load,
tencache copies the saved scalars (``step``) into the live state and each parameter group's settings (its
learning rate: an lr scheduler's own load leaves the groups' ``lr`` at its fresh value until its next step, after
the first resumed update), restores tensors that were kept in memory, and gives each swapped tensor the live state
lacks a placeholder of its size: the swapper registers it (``<name>-<ds_id>.tensor.swp``, stock's naming) and reads
the loaded file at the next swap-in.

A model rebuilt in the same process (destroy, a new ``zero.Init``, ``initialize``, ``load_checkpoint``: DeepSpeed's
own NVMe checkpoint tests do this) gets new parameter ids, so its sub-groups' swap files have other names than the
checkpoint's (``29_56.tensor.swp`` for the saved ``0_27.tensor.swp``): stock copies the checkpoint's files next to
its own and never reads them, and trains on from its fresh initialisation. tencache gives the loaded files the
current names, sub-group by sub-group in order (the same model has the same sub-groups), and rebuilds the
parameters from them (stage 3's ``reset_swap_buffers``, as the engine's load does).

More things a resume loses or stops at, in stock DeepSpeed too (a resume then differs from the uninterrupted run):
- Sub-groups too small to swap (below the aio block size) keep their fp32 masters and Adam state in memory even with
  the optimizer on NVMe. The checkpoint's ZeRO file holds them, but stock's NVMe load path never reads that file, and
  ``reset_swap_buffers`` then rebuilds those parameters from the fresh engine's initial masters: the first resumed
  loss is already wrong. tencache copies them back from the ZeRO file (``restore_unswapped_masters``), and gathers
  their persistent parameters again (the engine's load gathered them from the fresh partitions).
- DeepSpeedCPUAdam's C++ optimizer keeps beta1^t and beta2^t as running products, one multiplication per step. A
  fresh process (or an engine at another step) recomputes them with ``pow`` at its first update, which differs in
  the last bits: every loss from the second resumed step on differs. tencache replays the products
  (``replay_adam_step_products``, adam_beta_products.py), with the optimizer on NVMe or on cpu; not after a
  universal load, which resumes as stock CPU offload's does (install.py ``load_checkpoint_exactly`` says why).
- With parameters on NVMe and the optimizer on cpu, stage 3's ``_rigid_load_state_dict`` stops with
  ``'NoneType' object has no attribute 'data'`` (it copies the masters into flat 16-bit partitions that do not exist
  when parameters are on file). tencache rebuilds the parameters from the loaded masters as a step does
  (``rigid_load_with_params_on_file``).
- ``load_checkpoint(load_module_only=True)`` sets the fp32 masters from the loaded 16-bit weights in place, and
  with the optimizer on NVMe they are empty placeholders: it stops (stock's swappers too). tencache swaps each
  sub-group in to set it (``refresh_masters_swapping_in``). After ``load_optimizer_states=False`` the engine's NVMe
  branch copied the checkpoint's masters in: tencache sets them from the loaded 16-bit weights before that copy
  instead, and places no file (saved_layout.py), as stock CPU offload sets them (in bf16 the two differ).
- Such a load (no optimizer state) into an engine that has trained: the engine's NVMe branch copies the
  checkpoint's moment files over the live ones, so Adam goes on with the checkpoint's moments (registered,
  read at the next swap-in), where stock CPU offload keeps the live moments and step counts. tencache's copy of the
  folder places none of them then (``loading_checkpoint``; swap_files.py ``LoadPlaces``).
- A checkpoint laid out for another run (another world size, other sub-groups, the optimizer on cpu, universal):
  its swap files do not fit, or there are none; stock's NVMe load copied them in anyway and stopped, or dropped the
  loaded weights. tencache does as stock CPU offload (saved_layout.py), and loads the optimizer state of a cpu
  checkpoint (zero_file.py) and of a universal one (universal.py).
"""
import contextlib
import functools
import os

import torch
from deepspeed.checkpoint.constants import FP32_FLAT_GROUPS, LOSS_SCALER, OPTIMIZER_STATE_DICT
from deepspeed.runtime.swap_tensor.optimizer_utils import OptimizerSwapper

from ...io.stale_files import hidden_name
from ...log import logger
from .adam_beta_products import replay_beta_products
from .optimizer_swapper import TencacheOptimizerSwapper
from .swap_files import ADOPTING_KIND, SWAP_FILE_NAME, LoadPlaces, sub_group_order, swap_file_name
from .reporting import param_swappers_of_optimizer
from .saved_layout import places_for_saved_layout
from .zero_file import (holds_no_bytes, live_by_saved_id, load_zero_state, restore_group_settings,
                        restore_loss_scaling, start_adam_over)


@contextlib.contextmanager
def loading_checkpoint(engine, optimizer_state: bool, module_only: bool):
    """Around ``engine.load_checkpoint``: the engine copies the checkpoint's swap files over the swap folder, so
    every copy of optimizer state the host tier holds then is dropped before its next use (optimizer_swapper.py,
    ``swap_folder``); file timestamps are not trusted to say which copies went stale. A load without the
    optimizer's state, or of the module only, places none (swap_files.LoadPlaces): the live optimizer state stays
    the engine's, as with the optimizer on cpu, and the masters are the loaded weights."""
    swapper = getattr(getattr(engine, "optimizer", None), "optimizer_swapper", None)
    if not isinstance(swapper, TencacheOptimizerSwapper):
        yield
        return
    places = LoadPlaces.NOTHING if module_only else LoadPlaces.ALL if optimizer_state else LoadPlaces.MASTERS
    with swapper.loading_checkpoint(places, functools.partial(places_for_saved_layout, engine)):
        yield


def adopt_loaded_files(engine, load_dir, load_path) -> int:
    """After ``engine.load_checkpoint``: when the checkpoint's sub-group ids are not this engine's (a rebuilt
    model), rename the loaded swap files to this engine's ids and rebuild the parameters from them (a load of the
    optimizer's state: no other places files, ``loading_checkpoint``). The load placed files of ids this engine does
    not have hidden (``staged_load_name``); what is not adopted of them is deleted. Returns the number of files
    renamed (0: the ids matched, or nothing to do)."""
    optimizer = getattr(engine, "optimizer", None)
    swapper = getattr(optimizer, "optimizer_swapper", None)
    if not isinstance(swapper, TencacheOptimizerSwapper) or load_path is None:
        return 0
    if swapper.last_load_places is None or not swapper.last_load_places.places_files:  # none placed: saved_layout.py
        return 0
    try:
        return _adopt(swapper, optimizer, swapper.last_load_source)
    finally:
        swapper.drop_staged_loads()


def _adopt(swapper, optimizer, loaded_dir) -> int:
    loaded = {}
    for name in os.listdir(loaded_dir):
        match = SWAP_FILE_NAME.match(name)
        if match:
            loaded.setdefault(match["id"], []).append(match["state"])
    current = list(swapper.swap_params_info)  # sub-group order
    if not loaded or set(current) <= set(loaded):  # its own ids (beside other engines' files a stock save took)
        return 0
    if len(loaded) != len(current):
        logger.warning("the checkpoint in %s has %d optimizer sub-groups, this engine %d: its swap files are not "
                       "adopted (as in stock DeepSpeed)", loaded_dir, len(loaded), len(current))
        return 0
    # Two passes: the two sets of ids may overlap (a checkpoint from a process whose ids were shifted by whole
    # sub-groups), and a rename into an id still to be renamed from would overwrite that loaded file first.
    swapper.settle_master_writes()  # masters owed to the files about to be renamed (the load's own): written first
    staged = []
    try:
        for old, new in zip(sorted(loaded, key=sub_group_order), sorted(current, key=sub_group_order)):
            for state in loaded[old]:
                name = swap_file_name(old, state)
                source = os.path.join(swapper.files_folder, swapper.load_target_name(name))  # (where the copy put it)
                target = os.path.join(swapper.files_folder, swap_file_name(new, state))
                staging = os.path.join(swapper.files_folder, hidden_name(swap_file_name(new, state), ADOPTING_KIND))
                os.replace(source, staging)
                staged.append((staging, target))
    except BaseException:  # (a loaded file missing, say) nothing adopted: the ones renamed so far go too
        for staging, _target in staged:
            os.remove(staging)
        raise
    swapper.forget_master_copies()  # the parameter partitions hold this engine's masters, not the loaded ones
    for staging, target in staged:
        swapper.store.forget(target)  # a copy of this engine's own state: the loaded file replaces it
        os.replace(staging, target)
    swapper.narrow_loaded_states()
    renamed = len(staged)
    optimizer.reset_swap_buffers()  # read the adopted masters, rebuild the parameters from them
    logger.info("adopted %d loaded swap files from %s under this engine's sub-group ids", renamed, loaded_dir)
    return renamed


def restore_optimizer_scalars(engine, load_dir, load_path, load_optimizer_states=True, load_module_only=False) -> int:
    """After ``engine.load_checkpoint`` returned ``load_path``: copy the optimizer's saved scalar state (and the
    loss scaler's) into the live state when tencache swaps the optimizer. Returns how many optimizer state entries
    were restored."""
    optimizer = getattr(engine, "optimizer", None)
    swapper = getattr(optimizer, "optimizer_swapper", None)
    if not isinstance(swapper, TencacheOptimizerSwapper):
        return 0
    if load_path is None or not load_optimizer_states or load_module_only or \
            swapper.last_load_places is LoadPlaces.STATE_WRITTEN:  # set there already, with the tensors
        return 0
    zero_file, zero_state = load_zero_state(engine, os.path.dirname(load_path))
    if LOSS_SCALER in zero_state:  # with the optimizer's state, as stock CPU offload's load restores it
        restore_loss_scaling(optimizer, zero_state)
    saved = zero_state.get(OPTIMIZER_STATE_DICT)  # stage 3's dict holds the torch optimizer's under the same key
    if not saved or "state" not in saved:
        return 0
    optimizer._set_fp32_optimizer_param_groups()
    try:
        live_groups = optimizer.optimizer.param_groups
        by_saved_id = live_by_saved_id(saved["param_groups"], [group["params"] for group in live_groups])
        restored = 0
        for saved_id, saved_state in saved["state"].items():
            param = by_saved_id[saved_id]
            live = optimizer.optimizer.state[param]
            swap_info = swapper.swap_params_info.get(OptimizerSwapper.parameter_id(param))
            # its bytes are in the loaded swap folder: described in the ZeRO file, or (a checkpoint converted by
            # `tencache-ds checkpoint-for-cpu`) also there, but this engine swaps it: never all of them in memory
            swapped = {key: value for key, value in saved_state.items() if holds_no_bytes(value) or (
                swap_info is not None and torch.is_tensor(value) and value.dim() > 0)}
            missing = [key for key in swapped if key not in live and not _loaded_file_exists(swapper, swap_info, key)]
            if missing:
                # The loaded folder has no file for this sub-group's state (its tensors were renamed: a model rebuilt
                # in the same process gets new ids): leave its state as stock does (Adam starts over).
                logger.warning("optimizer sub-group %s: no loaded swap file for %s; its optimizer state is not "
                               "restored (as in stock DeepSpeed)", OptimizerSwapper.parameter_id(param), missing)
                continue
            placed = 0
            for key, value in saved_state.items():
                if key in swapped:  # its bytes are in the loaded swap folder
                    if key not in live:
                        live[key] = torch.empty(swap_info.numel(), dtype=value.dtype)  # untouched: no memory
                        placed += 1
                    continue
                live[key] = value.clone() if torch.is_tensor(value) else value
                restored += 1
            if placed:
                swapper.register_loaded_state(swap_info, param)
                restored += placed
        # torch's load_state_dict (stock CPU offload's load) replaces the whole state: a sub-group the checkpoint holds
        # no state for, or an empty one (saved before its first step), starts Adam over, whatever this engine trained
        with_state = {id(by_saved_id[saved_id]) for saved_id, saved_state in saved["state"].items() if saved_state}
        restored += start_adam_over(optimizer, [param for group in live_groups for param in group["params"]
                                                if id(param) not in with_state])
        restored += restore_group_settings(live_groups, saved["param_groups"], zero_file)
    finally:
        optimizer._clear_fp32_optimizer_param_groups()
    logger.info("restored %d optimizer state entries (Adam's step counts and moments, the groups' learning rates "
                "and settings) from %s, which stock DeepSpeed's NVMe load skips", restored, zero_file)
    return restored


def _loaded_file_exists(swapper, swap_info, key: str) -> bool:
    """The swap file stock's naming gives state tensor ``key`` of this sub-group (``<key>-<ds_id>.tensor.swp``,
    optimizer_utils._get_state_tensors) is in the swap folder."""
    if swap_info is None:
        return False
    folder = os.path.dirname(swap_info.tensors[0].swap_path)
    return os.path.exists(os.path.join(folder, swap_file_name(swap_info.param_id, key)))


def tencache_runs(optimizer) -> bool:
    """Does tencache swap this ZeRO-3 optimizer's state or its parameters?"""
    return isinstance(getattr(optimizer, "optimizer_swapper", None), TencacheOptimizerSwapper) or \
        bool(param_swappers_of_optimizer(optimizer))


def restore_unswapped_masters(engine, load_dir, load_path, load_module_only=False) -> int:
    """After ``engine.load_checkpoint`` with the optimizer on NVMe: the sub-groups too small to swap keep their fp32
    masters in memory, and stock's NVMe load never reads them from the checkpoint. Copy them from the ZeRO file and
    rebuild their parameters from them (what a step does after updating them). Returns how many were restored."""
    optimizer = getattr(engine, "optimizer", None)
    if not isinstance(getattr(optimizer, "optimizer_swapper", None), TencacheOptimizerSwapper):
        return 0
    # NOTHING: no optimizer state taken from the checkpoint, the masters are the loaded weights'; STATE_WRITTEN:
    # every master was set from the checkpoint's files, those in memory too
    if load_path is None or load_module_only or \
            optimizer.optimizer_swapper.last_load_places in (LoadPlaces.NOTHING, LoadPlaces.STATE_WRITTEN):
        return 0
    unswapped = [i for i in range(len(optimizer.fp32_partitioned_groups_flat))
                 if not optimizer._swappable_optimizer_subgroup(i)]
    if not unswapped:
        return 0
    zero_file, zero_state = load_zero_state(engine, os.path.dirname(load_path))
    saved = zero_state.get(FP32_FLAT_GROUPS)
    if saved is None or len(saved) != len(optimizer.fp32_partitioned_groups_flat):
        logger.warning("%s has %s fp32 groups, this engine %d: masters of the sub-groups kept in memory are not "
                       "restored (as in stock DeepSpeed)", zero_file, "no" if saved is None else len(saved),
                       len(optimizer.fp32_partitioned_groups_flat))
        return 0
    for sub_group_id in unswapped:
        master, loaded = optimizer.fp32_partitioned_groups_flat[sub_group_id], saved[sub_group_id]
        if loaded.shape != master.shape:
            raise ValueError(f"{zero_file}: fp32 group {sub_group_id} has shape {tuple(loaded.shape)}, this engine's "
                             f"{tuple(master.shape)}: the checkpoint is of another model or partitioning")
        master.data.copy_(loaded)
        optimizer._reassign_or_swap_out_partitioned_parameters(sub_group_id)
    logger.info("restored the fp32 masters of %d sub-groups kept in memory from %s (stock DeepSpeed's NVMe load "
                "skips them)", len(unswapped), zero_file)
    return len(unswapped)


def regather_persistent_parameters(optimizer) -> None:
    """After parameters were rebuilt from their masters outside the engine's load (``adopt_loaded_files``,
    ``restore_unswapped_masters``): gather the persistent ones (below ``stage3_param_persistence_threshold``, kept
    whole on every rank) again from their rebuilt partitions. The engine's load ended by gathering them
    (``checkpoint_event_epilogue``) before the rebuild: their whole copies were the fresh engine's, and the first
    resumed loss differed (found with Hugging Face's Trainer at 2 ranks: biases and layer norms in sub-groups too
    small to swap). They are released first, since a gather skips what is gathered already (stage 3's step
    partitions every parameter at its start for the same reason), and the epilogue runs again. A collective: the
    caller decides from what every rank has alike (the same sub-groups, the same checkpoint)."""
    persistent = optimizer.persistent_parameters
    if persistent:
        persistent[0].partition(param_list=persistent, has_been_updated=False)
    optimizer.checkpoint_event_epilogue()


def replay_adam_step_products(engine, load_path) -> int:
    """After a load of the optimizer's state: DeepSpeedCPUAdam's C++ optimizer is given the beta products the
    uninterrupted run has (adam_beta_products.py: a fresh process recomputes them with ``pow``, which differs in
    the last bits). Returns the number of C++ calls made."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # here: importing deepspeed.ops runs tencache's install hook

    optimizer = engine.optimizer
    base = getattr(optimizer, "optimizer", None)
    if not isinstance(base, DeepSpeedCPUAdam) or not tencache_runs(optimizer):
        return 0
    sub_groups = []  # (its step count, its betas, its eps), in the order stage 3 steps them
    for sub_group_id, master in enumerate(optimizer.fp32_partitioned_groups_flat):
        group = base.param_groups[optimizer.sub_group_to_group_id[sub_group_id]]
        step = int(base.state[master].get("step", 0)) if master in base.state else 0
        sub_groups.append((step, tuple(group["betas"]), group["eps"]))
    _zero_file, zero_state = load_zero_state(engine, os.path.dirname(load_path))
    return replay_beta_products(base, zero_state, sub_groups)


def rigid_load_with_params_on_file(rigid_load_state_dict):
    """stage 3's ``_rigid_load_state_dict`` (the ZeRO file's load, optimizer on cpu) for tencache's parameters on file:
    stock copies the loaded masters into flat 16-bit partitions, which do not exist when parameters are swapped
    (``'NoneType' object has no attribute 'data'``); here the parameters are rebuilt from the loaded masters as a step
    rebuilds them (``_reassign_or_swap_out_partitioned_parameters``: into the partition, or written to its file)."""
    @functools.wraps(rigid_load_state_dict)
    def rigid_load_rebuilding_params(self, state_dict, load_optimizer_states=True):
        if all(flat is not None for flat in self.fp16_partitioned_groups_flat) or not tencache_runs(self):
            return rigid_load_state_dict(self, state_dict, load_optimizer_states=load_optimizer_states)
        # stage3.py _rigid_load_state_dict (0.19.8), up to the restore of the 16-bit partitions
        restore_loss_scaling(self, state_dict)
        saved_partition_groups = state_dict.get("ds_zero_partition_groups")
        if saved_partition_groups is not None and saved_partition_groups != self._zero3_partition_group_metadata():
            raise RuntimeError("AutoEP ZeRO-3 checkpoints can only be loaded with the same parameter placement "
                               "topology in this release.")
        if load_optimizer_states:
            self._set_fp32_optimizer_param_groups()
            self.optimizer.load_state_dict(state_dict[OPTIMIZER_STATE_DICT])
            self._clear_fp32_optimizer_param_groups()
        if self.swap_optimizer:
            self.optimizer_swapper.purge_state()
            timer_names = set()
            self._partition_all_parameters()
            for sub_group_id in range(len(self.fp16_groups)):
                self._prepare_sub_group(sub_group_id, timer_names)
                self._reassign_or_swap_out_partitioned_parameters(sub_group_id)
                self._release_sub_group(sub_group_id, timer_names)
            self._post_step(timer_names)
        for master, loaded in zip(self.fp32_partitioned_groups_flat, state_dict[FP32_FLAT_GROUPS]):
            master.data.copy_(loaded.data)
        for sub_group_id in range(len(self.fp32_partitioned_groups_flat)):
            self._reassign_or_swap_out_partitioned_parameters(sub_group_id)

    return rigid_load_rebuilding_params


def masters_from_loaded_weights(optimizer) -> bool:
    """After a load without the optimizer's state (``load_optimizer_states=False`` or ``load_module_only``) with the
    optimizer on NVMe under tencache: set the fp32 masters from the loaded 16-bit weights, as stock CPU offload does
    (``_restore_from_bit16_weights``). The engine's NVMe branch instead copies the checkpoint's swap folder in
    whatever was asked and rebuilds the parameters from its masters: in bf16 the masters then kept the checkpoint's
    fp32 bits where CPU offload's are the 16-bit weights widened, and the losses differed from the first update on
    (a fresh process; module only also after the refresh that ran before the copy). Returns whether the masters
    were set."""
    swapper = getattr(optimizer, "optimizer_swapper", None)
    if not isinstance(swapper, TencacheOptimizerSwapper):
        return False
    if swapper.last_load_places is LoadPlaces.NOTHING:  # set before the copy, which placed no master over them
        return True
    optimizer.refresh_fp32_params()  # refresh_masters_swapping_in: each sub-group swapped in, set, swapped out
    return True


def set_master_from_16bit_weights(optimizer, sub_group_id: int, master) -> None:
    """One sub-group's fp32 master set from its 16-bit weights, as ``_restore_from_bit16_weights`` sets it from the
    flat 16-bit partition; a sub-group without one (its parameters on file beyond ``offload_param.max_in_cpu``,
    which configs/stock-nvme.json sets to 0: every sub-group) reads its parameters' partitions from their files, as
    stage 3 builds the masters at start-up (``_swap_in_sub_group_to_flat_buffer``). Stock stops there, half-loaded
    (``'NoneType' object has no attribute 'data'``, with the optimizer on cpu or on NVMe)."""
    bit16 = optimizer.fp16_partitioned_groups_flat[sub_group_id]
    if bit16 is not None:
        master.data.copy_(bit16.data)
        return
    # a read a prefetch asked for that nothing waited for (INFLIGHT: an evaluation's last forward) lands first: stage
    # 3 copies any partition not NOT_AVAILABLE as it is, and its placeholder's 1 would fill the fragment (helper-196)
    swappers = {id(swapper): swapper for swapper in (getattr(param, "nvme_swapper", None)
                                                      for param in optimizer.fp16_groups[sub_group_id])
                if swapper is not None}
    for swapper in swappers.values():
        swapper.synchronize_reads()
    optimizer._swap_in_sub_group_to_flat_buffer(master, sub_group_id)


def restoring_masters_from_files(restore_from_bit16_weights):
    """stage 3's ``_restore_from_bit16_weights`` (a load without the optimizer's state, or of the module only, with
    the optimizer in memory sets the fp32 masters from the loaded 16-bit weights) where tencache's parameters are on
    file beyond ``max_in_cpu``: each master is set by ``set_master_from_16bit_weights``."""
    @functools.wraps(restore_from_bit16_weights)
    def restore_reading_partitions_on_file(self):
        if all(flat is not None for flat in self.fp16_partitioned_groups_flat) or not tencache_runs(self):
            return restore_from_bit16_weights(self)
        for sub_group_id, master in enumerate(self.fp32_partitioned_groups_flat):
            set_master_from_16bit_weights(self, sub_group_id, master)

    return restore_reading_partitions_on_file


def refresh_masters_swapping_in(refresh_fp32_params):
    """stage 3's ``refresh_fp32_params`` (``load_checkpoint(load_module_only=True)`` calls it: the fp32 masters are
    set from the loaded 16-bit weights) with tencache swapping the optimizer: stock copies into each master in
    place, which with the optimizer on NVMe is an empty placeholder ("The size of tensor a (0) must match the size
    of tensor b", stock's swappers and tencache's alike). Here each sub-group is swapped in, its master set
    (``set_master_from_16bit_weights``), and swapped out, as the step does."""
    @functools.wraps(refresh_fp32_params)
    def refresh_fp32_params_swapping_in(self):
        if not isinstance(getattr(self, "optimizer_swapper", None), TencacheOptimizerSwapper):
            return refresh_fp32_params(self)
        timer_names = set()
        for sub_group_id, master in enumerate(self.fp32_partitioned_groups_flat):
            self._prepare_sub_group(sub_group_id, timer_names)
            try:
                set_master_from_16bit_weights(self, sub_group_id, master)
            finally:  # (a partition's read that failed: the sub-group goes back all the same, not lent for good)
                self._release_sub_group(sub_group_id, timer_names)

    return refresh_fp32_params_swapping_in
