"""Frozen parameters' fragments in a checkpoint (engine.py's ``frozen_param_fragments``: each frozen parameter's
partition, saved beside the module and copied back into ``param.ds_tensor`` at a load) where the partition is on
file with one of our parameter swappers. Owns: reading such a partition for the save, and the load's copy into it.

Why: on file a partition's ``ds_tensor`` is the swapped-out placeholder (a 0-dim tensor). The save stored it, and
zero_to_fp32 and a load without the optimizer's state stopped on it ("zero-dimensional tensor cannot be
concatenated"); a load copied the saved placeholder into the placeholder, so frozen weights were never loaded
(helper-182's review; stock NVMe does both). Stock CPU offload saves and loads the fragments.
"""
import functools
import inspect

from deepspeed.checkpoint.constants import FROZEN_PARAM_FRAGMENTS
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus
from deepspeed.runtime.utils import is_optimized_parameter

from ...log import logger
from .param_swapper import TencacheParamSwapper


def reading_frozen_fragments_from_file(get_fragment):
    """engine._get_param_fragment_func (a frozen parameter's fragment for the save: ``ds_tensor`` on the CPU): a
    partition of ours on file is read into a tensor of its own, and its slot given back."""
    @functools.wraps(get_fragment)
    def fragment_read_from_file(self, param):
        swapper = _our_swapper(param)
        if swapper is not None:
            _landed(swapper, param)
        if swapper is None or param.ds_tensor.status != PartitionedParamStatus.NOT_AVAILABLE:
            return get_fragment(self, param)
        swapper.swap_in([param], async_op=False)
        try:
            return param.ds_tensor.detach().to("cpu", copy=True)
        finally:
            swapper.remove_partition_and_release_buffers([param])

    return fragment_read_from_file


def loading_frozen_fragments_into_files(load_module_state_dict):
    """engine.load_module_state_dict, which copies a checkpoint's frozen fragments into ``param.ds_tensor`` last
    (after a weights-only load's GatheredParameters has put the placeholders back): where a frozen partition is ours,
    stock's copy is left out and the fragments are copied here instead, one partition at a time (read, copied, marked
    changed, given back: all of them read at once took a base model's partitions into host memory together;
    helper-188's review)."""
    signature = inspect.signature(load_module_state_dict)

    @functools.wraps(load_module_state_dict)
    def load_then_copy_frozen_fragments(self, *args, **kwargs):
        checkpoint = signature.bind(self, *args, **kwargs).arguments["checkpoint"]
        fragments = checkpoint.get(FROZEN_PARAM_FRAGMENTS)
        frozen = [param for param in self.module.parameters() if not is_optimized_parameter(param)]
        if fragments is None or all(_our_swapper(param) is None for param in frozen):
            return load_module_state_dict(self, *args, **kwargs)
        checkpoint[FROZEN_PARAM_FRAGMENTS] = None
        try:
            result = load_module_state_dict(self, *args, **kwargs)
        finally:
            checkpoint[FROZEN_PARAM_FRAGMENTS] = fragments
        _copy_frozen_fragments(self, frozen, fragments)
        return result

    return load_then_copy_frozen_fragments


def _copy_frozen_fragments(engine, frozen, fragments) -> None:
    """Stock's copy of the saved fragments (engine.load_module_state_dict's last loop), ours on file read and written
    back. A saved fragment that is a swapped-out placeholder (a 0-dim tensor: a checkpoint of stock's NVMe offload,
    or of tencache before 2026-12-07) holds no weights: the partition keeps its own, as those loads left it (copied,
    the placeholder's 1 filled the whole partition)."""
    placeholders = []
    for param in frozen:
        if param not in engine.param_names:
            raise ValueError(f"failed to find frozen {param} in named params")  # (stock's error)
        name = engine.param_names[param]
        saved, swapper = fragments[name], _our_swapper(param)
        if swapper is None:
            (param.ds_tensor if hasattr(param, "ds_id") else param).data.copy_(saved.data)
        elif saved.dim() == 0:  # (a fragment of another size is no placeholder: its copy raises, as stock's)
            placeholders.append(name)
        else:
            _copy_into_partition(swapper, param, saved)
    if placeholders:
        logger.warning("load_checkpoint: the checkpoint holds no weights of %d frozen parameters on NVMe (%s%s): "
                       "saved as their swapped-out placeholders (by stock NVMe offload, or tencache_ds before "
                       "2026-12-07); they keep the weights they have", len(placeholders), ", ".join(placeholders[:3]),
                       " ..." if len(placeholders) > 3 else "")


def _landed(swapper, param) -> None:
    """A read a prefetch asked for that nothing waited for (INFLIGHT: an evaluation's last forward) lands first: its
    ``ds_tensor`` is the placeholder until then, which the save stored as the fragment, and into which the load's
    copy raised (helper-210; the masters' load does the same: checkpoint.set_master_from_16bit_weights)."""
    if param.ds_tensor.status == PartitionedParamStatus.INFLIGHT:
        swapper.synchronize_reads()


def _copy_into_partition(swapper, param, saved) -> None:
    _landed(swapper, param)
    on_file = param.ds_tensor.status == PartitionedParamStatus.NOT_AVAILABLE
    if on_file:
        swapper.swap_in([param], async_op=False)
    try:
        param.ds_tensor.data.copy_(saved.data)
        swapper.partitions_rewritten_in_place([param])  # its new bytes are owed to its file
    finally:
        if on_file:
            swapper.remove_partition_and_release_buffers([param])


def _our_swapper(param):
    swapper = getattr(param, "nvme_swapper", None)
    ok = isinstance(swapper, TencacheParamSwapper) and getattr(param, "ds_tensor", None) is not None
    return swapper if ok else None
