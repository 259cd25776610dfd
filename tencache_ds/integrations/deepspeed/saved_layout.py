"""Whether a checkpoint's optimizer swap files fit this engine and are all there. Owns: the check made when the
engine's load starts copying them over the swap folder (``places_for_saved_layout``, called through
``TencacheOptimizerSwapper.begin_load_copy``), and what a load does when they do not fit or some are missing.

The swap files hold each rank's sub-groups (fp32 masters and optimizer state), sized for the world size, the
``sub_group_size`` and the model they were saved with. Stock DeepSpeed compares world sizes before it loads the
optimizer's state (``_load_zero_checkpoint``: "Automatic adjustment ... not currently supported"), and torch's
``load_state_dict`` stops on other sub-groups ("a parameter group that doesn't match the size"); stock CPU offload
stops there, and without the optimizer's state sets the masters from the loaded weights
(``_restore_from_bit16_weights``), which ZeRO-3 partitions for this run. The engine's load with the optimizer on
NVMe skips both: it copied the files in whatever they were, and the first swap-in stopped on a file of the wrong
size (an assertion in stock's aio op; tencache's "holds N bytes but M were expected ... written by another run"),
or, with another number of sub-groups, tencache adopted none and the engine rebuilt the parameters from the live
masters, silently dropping the loaded weights; a checkpoint saved with the optimizer on cpu has no swap files at
all (FileNotFoundError); a universal checkpoint neither (and its weights are loaded by the function skipped).

So, when the files do not fit: a load of the optimizer's state stops before any file is placed (stock CPU
offload's error for the world size, one naming the cause otherwise), except where there are none because the
optimizer was on cpu: its state is in the ZeRO file, and is written into this engine's swap files from there
(zero_file.py), as stock CPU offload loads it; a load without it sets the masters from the loaded weights, as stock
CPU offload does, and places nothing (the engine rebuilds the parameters from the masters right after the copy:
``reset_swap_buffers``). A universal checkpoint is loaded from its own files, state or weights (universal.py).

Files that fit can still be too few: a state file the ZeRO file describes may be missing (a save that did not finish
on every rank, a copy that lost files). A load of the optimizer's state then stops too, naming them: it went on, and
Adam started over for those sub-groups (a fresh engine) or kept its own state from after the save (a continued one).
A load of the optimizer's state agrees these refusals over the ranks (and refuses where some ranks' swap folders
are missing), so that no rank goes on alone into the load's next collective.
"""
import itertools
import os
from typing import Dict, List, Optional, Tuple

from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT
from deepspeed.runtime.zero.utils import ZeRORuntimeException

from ...errors import TencacheError
from ...log import logger
from ...plan.workload import MAX_INTRA_OP_PARALLELISM
from .agreement import agree_min, raised_on_every_rank
from .config_bridge import io_aligned_numel
from .swap_files import LOAD_REFUSED, SWAP_FILE_NAME, LoadPlaces, sub_group_order, swap_file_name
from .universal import load_state_from_universal, load_weights_from_universal
from .zero_file import holds_no_bytes, live_param_groups, load_state_from_zero_file, load_zero_state

# A checkpoint's swap files were padded for at most MAX_INTRA_OP_PARALLELISM aio threads (the padding is 1 KiB per
# thread; a run with more is refused at start-up: plan/workload.py), so sub-groups whose sizes differ by more than
# 64 KiB are told apart by their files. (Stock's checkpoint of a run with more is taken for another layout.)


def places_for_saved_layout(engine, places: LoadPlaces, source: str) -> LoadPlaces:
    """What the engine's copy of the checkpoint's swap files in ``source`` may place: ``places``; NOTHING when they
    do not fit and the optimizer's state was not asked for (the masters are then set from the loaded weights here);
    STATE_WRITTEN when there are none and it was (its state is written into the swap files from the ZeRO file here).
    A universal checkpoint has none: its state (STATE_WRITTEN) or its weights (NOTHING) are written from its files
    here. Raises when the state was asked for and the files do not fit."""
    tag_folder = os.path.dirname(os.path.dirname(source))  # source: <tag>/offloaded_tensors/rankNN
    if engine.load_universal_checkpoint():  # no swap files, and at any world size: universal.py
        # (stopped on every rank where it stops on any, as a ZeRO file's load: _load_state_from_zero_file_on_every_rank)
        if places is LoadPlaces.ALL:
            raised_on_every_rank(lambda: load_state_from_universal(engine, tag_folder), lambda: TencacheError(
                "load_checkpoint of a universal checkpoint: another rank could not load its optimizer state (its "
                "error says why); the load stops on every rank: load a checkpoint that every rank can load before "
                "training on."))
            return LoadPlaces.STATE_WRITTEN
        # as stock CPU offload, in a load of the module only too
        raised_on_every_rank(lambda: load_weights_from_universal(engine, tag_folder), lambda: TencacheError(
            "load_checkpoint of a universal checkpoint: another rank could not load its weights (its error says "
            "why); the load stops on every rank."))
        return LoadPlaces.NOTHING
    if places is LoadPlaces.NOTHING:
        return places
    if places is LoadPlaces.MASTERS:
        # Without the optimizer's state the masters are the loaded weights, as stock CPU offload sets them
        # (_restore_from_bit16_weights): set here, before the copy, which then places none of the checkpoint's files
        # and rebuilds the partitions from them. The checkpoint's master files were placed where they fit until
        # 2026-12-07: placed by position, over weights the module's load had set by name, they scrambled a model
        # whose parameters were registered in another order (the same names and shapes: helper-192), and the masters
        # were set from the weights after the load all the same. refresh_masters_swapping_in: each sub-group swapped
        # in, set (from its parameters' files beyond max_in_cpu), swapped out; a drive's error on one rank stops
        # every rank (the others would go on into the load's gathers).
        raised_on_every_rank(engine.optimizer.refresh_fp32_params, lambda: TencacheError(
            "load_checkpoint(load_optimizer_states=False): another rank could not set its fp32 masters from the "
            "loaded weights (its error says why); the load stops on every rank."))
        logger.info("load_checkpoint(load_optimizer_states=False): the fp32 masters are set from the loaded "
                    "weights, and none of the checkpoint's swap files is placed")
        return LoadPlaces.NOTHING
    misfit = _misfit_agreed(engine, tag_folder, source)  # the optimizer's state, from files that may not fit
    if misfit is None:
        return places
    # saved with the optimizer on cpu: its ZeRO file has it (_misfit_agreed raised for every other misfit)
    _load_state_from_zero_file_on_every_rank(engine, tag_folder, source)
    return LoadPlaces.STATE_WRITTEN


# why a checkpoint's swap files do not fit (_misfit's first value)
OTHER_WORLD_SIZE, NO_SWAP_FILES, OTHER_SUB_GROUPS = "other world size", "no swap files", "other sub-groups"


def _misfit(engine, source: str) -> Optional[Tuple[str, str]]:
    """(the cause, a sentence saying it), or None when the checkpoint's swap files in ``source`` fit."""
    saved_ranks, ranks = engine.loaded_checkpoint_dp_world_size, engine.seq_dp_world_size
    if saved_ranks is not None and saved_ranks != ranks:
        return OTHER_WORLD_SIZE, (f"the checkpoint's optimizer swap files are partitioned for {saved_ranks} ranks, "
                                  f"this run has {ranks}")
    if not os.path.isdir(source):
        return NO_SWAP_FILES, (f"the checkpoint has no optimizer swap files ({source} does not exist: it was saved "
                               f"with zero_optimization.offload_optimizer.device cpu or none)")
    mismatch = sub_group_layout_mismatch(engine.optimizer.optimizer_swapper, source)
    if mismatch is None:
        mismatch = _swapped_then_kept_in_memory(engine.optimizer, source)
    return None if mismatch is None else (OTHER_SUB_GROUPS,
                                          f"the checkpoint's optimizer swap files in {source} have {mismatch}")


def _swapped_then_kept_in_memory(stage3, source: str) -> Optional[str]:
    """A sub-group this engine keeps in memory (below the swap threshold, ``aio.block_size``) whose files the
    checkpoint has (swapped when it was saved): the match by id leaves it out, and its saved moments were dropped
    (a fresh engine started its Adam over; one that loads again kept its own moments with the checkpoint's step:
    helper-172). Named, for a refusal before anything is placed; None where there is none. Asked only where the
    swapped sub-groups matched by id: matched by order (ids shifted), a kept sub-group's id may be another's at the
    save, and the count already tells a sub-group more swapped then (helper-174)."""
    saved = _saved_master_sizes(source)
    swapped = getattr(getattr(stage3, "optimizer_swapper", None), "swap_params_info", None) or {}
    if not set(swapped) <= set(saved):  # matched by order
        return None
    for index, flat in enumerate(getattr(stage3, "fp32_partitioned_groups_flat", None) or []):
        ds_id = getattr(flat, "ds_id", None)
        if ds_id is not None and str(ds_id) in saved and not stage3._swappable_optimizer_subgroup(index):
            return (f"files of sub-group {ds_id}, which this engine keeps in memory ({flat.numel()} elements, below "
                    f"the swap threshold: was aio.block_size smaller at the save?)")
    return None


def _misfit_agreed(engine, tag_folder: str, source: str) -> Optional[Tuple[str, str]]:
    """``_misfit`` for a load of the optimizer's state, with every refusal agreed over the ranks: it raises on every
    rank where any rank's files do not fit, lack what the ZeRO file describes, cannot be checked, or where some
    ranks have a swap folder and others none (a save that did not finish on every rank: a rank without one would load
    from its ZeRO file alone). Returns the misfit that is left: None, or NO_SWAP_FILES on every rank."""
    try:
        misfit = _misfit(engine, source)
        if misfit is None:
            refusal = _incomplete(engine, tag_folder, source)
        elif misfit[0] == NO_SWAP_FILES:
            refusal = None  # saved with the optimizer on cpu: loaded from the ZeRO file (if no rank has a folder)
        else:
            refusal = _masters_missing(engine, tag_folder, source) if misfit[0] == OTHER_SUB_GROUPS else None
            refusal = refusal or _refusal(engine, *misfit)
    except Exception as err:  # noqa: BLE001  (refused on every rank, not raised on this one alone)
        misfit, refusal = None, err
        if not isinstance(err, TencacheError):
            refusal = TencacheError(f"load_checkpoint: the checkpoint's optimizer swap files in {source} could not "
                                    f"be checked ({type(err).__name__}: {err}). {LOAD_REFUSED}")
            refusal.__cause__ = err
    _refuse_on_any_rank(refusal, source)
    return misfit


def _load_state_from_zero_file_on_every_rank(engine, tag_folder: str, source: str) -> None:
    """``load_state_from_zero_file``, stopped on every rank where it stops on any (this rank's ZeRO file missing or
    unreadable, its masters without their bytes): the others went on into the load's next collective, to wait there
    for the rank that had stopped (helper-152's review)."""
    raised_on_every_rank(lambda: load_state_from_zero_file(engine, tag_folder, source), lambda: TencacheError(
        "load_checkpoint: another rank could not load its optimizer state from the checkpoint's ZeRO file (its error "
        "says why); this rank's is written into its swap files, but the load stops on every rank: load a checkpoint "
        "that every rank can load before training on."))


def _incomplete(engine, tag_folder: str, source: str) -> Optional[Exception]:
    """Why the checkpoint's swap files cannot be loaded though they fit: state files its ZeRO file describes are
    missing (a save that did not finish on every rank, a copy that lost files). Without this check the load went
    on: a fresh engine's Adam started over for those sub-groups, with a warning, and a continued engine silently
    kept its own state from after the save beside the loaded masters."""
    regrouped = _other_parameter_groups(engine, tag_folder)
    if regrouped is not None:
        return regrouped
    missing = missing_state_files(engine, tag_folder, source)
    if not missing:
        return None
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return TencacheError(
        f"load_checkpoint: the checkpoint is incomplete: {len(missing)} optimizer state file(s) that its ZeRO file "
        f"describes are not in {source}, or shorter than their sub-groups ({shown}). Was the save interrupted, or "
        f"the checkpoint copied without them? Load a complete checkpoint, or load the weights only: "
        f"load_checkpoint(..., load_optimizer_states=False). {LOAD_REFUSED}")


def _masters_missing(engine, tag_folder: str, source: str) -> Optional[Exception]:
    """Why a checkpoint with fewer master files than this engine swaps cannot be loaded where its ZeRO file
    describes more sub-groups swapped at the save (their state without bytes) than there are master files: a save
    stopped while it placed them (they come first) or a copy lost some, not a change of layout, which the refusal
    said (helper-237). None otherwise: a save that swapped fewer sub-groups (a larger aio.block_size then) is the
    layout refusal's (helper-239)."""
    saved = len(_saved_master_sizes(source))
    if saved >= len(engine.optimizer.optimizer_swapper.swap_params_info):
        return None
    _zero_file, stage3 = load_zero_state(engine, tag_folder)
    torch_state = stage3.get(OPTIMIZER_STATE_DICT) or {}
    swapped_at_save = sum(1 for state in (torch_state.get("state") or {}).values()
                          if any(holds_no_bytes(value) for value in state.values()))
    if saved >= swapped_at_save:
        return None
    return TencacheError(
        f"load_checkpoint: the checkpoint is incomplete: its ZeRO file describes {swapped_at_save} optimizer "
        f"sub-groups swapped at the save, and {source} holds the master files of {saved}. Was the save interrupted, "
        f"or the checkpoint copied without them? Load a complete checkpoint, or load the weights only: "
        f"load_checkpoint(..., load_optimizer_states=False). {LOAD_REFUSED}")


def _other_parameter_groups(engine, tag_folder: str) -> Optional[Exception]:
    """The checkpoint's parameter groups where they are not this engine's (their sub-group counts): torch's load,
    stock CPU offload's, refuses them ("different number of parameter groups", "doesn't match the size of optimizer's
    group"). The swap files fitted by size and order, so a model regrouped with its sub-groups' sizes kept was
    loaded, each group's settings (lr, weight decay) copied by its index or left as configured (helper-190)."""
    _zero_file, stage3 = load_zero_state(engine, tag_folder)
    saved = [len(group["params"]) for group in (stage3.get(OPTIMIZER_STATE_DICT) or {}).get("param_groups", [])]
    live = [len(group) for group in live_param_groups(engine.optimizer)]
    if not saved or saved == live:
        return None
    return TencacheError(
        f"load_checkpoint: the checkpoint's parameter groups hold {saved} optimizer sub-groups, this engine's {live}: "
        f"its optimizer state cannot be loaded into these groups (stock CPU offload stops too). Were the parameters "
        f"grouped otherwise (model_parameters given to deepspeed.initialize) since the save? Group them as they "
        f"were, or load the weights only: load_checkpoint(..., load_optimizer_states=False). {LOAD_REFUSED}")


def _refuse_on_any_rank(refusal: Optional[Exception], source: str) -> None:
    """Raise ``refusal`` where there is one, and on every rank where any rank has one, or where some ranks have
    their swap folder in the checkpoint (``source``, this rank's) and others none: a rank that goes on would wait
    for the one that stopped in the load's next collective. Every rank's load copies its own swap folder, so every
    rank passes here once per load of the optimizer's state, in the same order (contract.py)."""
    has_folder = os.path.isdir(source)
    none_refused, every_folder, no_folder = agree_min([refusal is None, has_folder, not has_folder])
    if refusal is None and not every_folder and not no_folder:
        which = ("this rank's optimizer swap folder is missing while other ranks' are there" if not has_folder
                 else "other ranks' optimizer swap folders are missing while this rank's is there")
        refusal = TencacheError(
            f"load_checkpoint: the checkpoint is incomplete: {which} ({source}; a save that did not finish on every "
            f"rank?). Load a complete checkpoint, or load the weights only: load_checkpoint(..., "
            f"load_optimizer_states=False). {LOAD_REFUSED}")
    if refusal is not None:
        raise refusal
    if not none_refused:
        raise TencacheError(f"load_checkpoint: another rank refused the checkpoint's optimizer swap files (its error "
                            f"says why). {LOAD_REFUSED}")


def _refusal(engine, cause: str, why: str) -> Exception:
    weights_only = "load the weights only: load_checkpoint(..., load_optimizer_states=False)"
    if cause == OTHER_WORLD_SIZE:  # stock CPU offload's own error, then ours
        saved_ranks, ranks = engine.loaded_checkpoint_dp_world_size, engine.seq_dp_world_size
        return ZeRORuntimeException(
            f"The checkpoint being loaded used a DP world size of {saved_ranks} but the current world size is {ranks}. "
            f"Automatic adjustment of ZeRO's optimizer state partitioning with a new world size is not currently "
            f"supported (DeepSpeed's own check, which its load with the optimizer on NVMe skips: {why}). Resume with "
            f"{saved_ranks} ranks, or {weights_only}. {LOAD_REFUSED}")
    return TencacheError(
        f"load_checkpoint: {why}: its optimizer state cannot be loaded into this engine's sub-groups (stock CPU "
        f"offload stops too: a parameter group that doesn't match the size of the optimizer's). Did "
        f"zero_optimization.sub_group_size, aio.block_size (which sub-groups are swapped), aio.intra_op_parallelism, "
        f"the model or its frozen parameters change since the save? Load with those as they were, or "
        f"{weights_only}. {LOAD_REFUSED}")


def sub_group_layout_mismatch(swapper, folder: str) -> Optional[str]:
    """Why the fp32 master files in ``folder`` (a checkpoint's) cannot be ``swapper``'s sub-groups, or None when
    they can: each file the size a swap of its sub-group writes at some ``aio.intra_op_parallelism`` (its
    padding). By id where the checkpoint has every sub-group of this engine (a stock save of a folder other engines
    share takes their files too); else in sub-group order, as many (ids differ in a rebuilt model: adoption renames
    them)."""
    saved = _saved_master_sizes(folder)
    saved_ids = saved_ids_by_sub_group(swapper, saved)
    if saved_ids is None:
        return f"{len(saved)} optimizer sub-groups, this engine {len(swapper.swap_params_info)}"
    own_intra_op = int(swapper.aio_config.get("intra_op_parallelism", 1))
    for sub_group, saved_id in saved_ids.items():
        saved_bytes = saved[saved_id]
        numel = swapper.swap_params_info[sub_group].numel()
        if not any(saved_bytes == io_aligned_numel(numel, swapper.dtype, intra_op) * swapper.swap_element_size
                   for intra_op in range(1, MAX_INTRA_OP_PARALLELISM + 1)):
            return (f"sub-group {saved_id}'s master file holds {saved_bytes} bytes, for this engine's sub-group "
                    f"{sub_group} of {numel} elements")
        # this engine reads its own padding: a file padded less (a smaller intra_op_parallelism at the save) was
        # accepted, placed, then its read stopped the load as "truncated" with the live files already replaced
        # (helper-182's review)
        own_bytes = io_aligned_numel(numel, swapper.dtype, own_intra_op) * swapper.swap_element_size
        if saved_bytes < own_bytes:
            return (f"sub-group {saved_id}'s master file holds {saved_bytes} bytes, padded for a smaller "
                    f"aio.intra_op_parallelism than this engine's {own_intra_op}, which reads {own_bytes} bytes for "
                    f"its sub-group {sub_group} of {numel} elements")
    return None


def _saved_master_sizes(folder: str) -> Dict[str, int]:
    """{sub-group id: bytes} of the fp32 master files in ``folder``."""
    return {match["id"]: os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)
            if (match := SWAP_FILE_NAME.match(name)) and match["state"] is None}


def saved_ids_by_sub_group(swapper, saved: Dict[str, int]) -> Optional[Dict[str, str]]:
    """{this engine's sub-group id: the id of its files in a checkpoint whose master files are ``saved``
    (``_saved_master_sizes``)}, by id where the checkpoint has every sub-group of this engine, else in sub-group
    order; None where the checkpoint has another number of them."""
    current = sorted(swapper.swap_params_info, key=sub_group_order)
    if set(current) <= set(saved):
        return {sub_group: sub_group for sub_group in current}
    if len(saved) != len(current):
        return None
    return dict(zip(current, sorted(saved, key=sub_group_order)))


def missing_state_files(engine, tag_folder: str, source: str) -> List[str]:
    """The optimizer state files this rank's ZeRO file in ``tag_folder`` describes without bytes (their bytes are
    in the swap files) that are not in the checkpoint's swap folder ``source``, whose masters fit this engine."""
    _zero_file, stage3 = load_zero_state(engine, tag_folder)
    live_ids = [getattr(flat, "ds_id", None) for flat in engine.optimizer.fp32_partitioned_groups_flat]
    swapper = engine.optimizer.optimizer_swapper
    saved_ids = saved_ids_by_sub_group(swapper, _saved_master_sizes(source))
    numels = {sub_group: info.numel() for sub_group, info in swapper.swap_params_info.items()}
    return described_files_absent(stage3.get(OPTIMIZER_STATE_DICT) or {}, live_ids, saved_ids, source, numels,
                                  swapper.swap_element_size)


def described_files_absent(torch_state: dict, live_ids: List[Optional[str]], saved_ids: Dict[str, str],
                           folder: str, numels: Optional[Dict[str, int]] = None, element_bytes: int = 1) -> List[str]:
    """The paths under ``folder`` of the swapped state tensors ``torch_state`` (a torch optimizer's state dict, as
    a ZeRO file saves it) describes without bytes and ``folder`` lacks, or holds fewer bytes than the sub-group's
    elements (``numels``, by live id) in the described dtype (a copy cut short: it was placed, and the first step
    stopped on it part way through the update: helper-210). Described: by tencache's meta tensor; stage 3's empty
    placeholder is fp32 whatever the file's dtype (bf16 masters' state), so there the smaller of its and this
    swapper's ``element_bytes``. The torch optimizer numbers the masters in group order,
    the sub-groups' order: its n-th parameter is sub-group ``live_ids[n]``, whose files in ``folder`` are named
    ``saved_ids[live_ids[n]]``. A sub-group not swapped (kept in memory) has its state in the ZeRO file.
    (A state tensor that is truly empty cannot be told from stage 3's empty placeholder: it would be looked for too;
    ``zero_file.load_state_from_zero_file`` has the same limit.)"""
    order = itertools.chain.from_iterable(group["params"] for group in torch_state.get("param_groups", []))
    state = torch_state.get("state", {})
    missing = []
    for saved_param, live_id in zip(order, live_ids):
        saved_id = saved_ids.get(live_id)
        if saved_id is None:
            continue
        least = (numels or {}).get(live_id, 0)
        for key, value in state.get(saved_param, {}).items():
            path = os.path.join(folder, swap_file_name(saved_id, key))
            if not holds_no_bytes(value):
                continue
            size = value.element_size() if value.is_meta else min(value.element_size(), element_bytes)
            if not os.path.isfile(path) or os.path.getsize(path) < least * size:
                missing.append(path)
    return missing
