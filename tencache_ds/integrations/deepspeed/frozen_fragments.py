"""Frozen parameters' fragments in a checkpoint (engine.py's ``frozen_param_fragments``: each frozen parameter's
partition, saved beside the module and copied back into ``param.ds_tensor`` at a load) where the partition is on
file with one of our parameter swappers. Owns: reading such a partition for the save, and having it present for the
load's copy and written back after.

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

from .param_swapper import TencacheParamSwapper


def reading_frozen_fragments_from_file(get_fragment):
    """engine._get_param_fragment_func (a frozen parameter's fragment for the save: ``ds_tensor`` on the CPU): a
    partition of ours on file is read into a tensor of its own, and its slot given back."""
    @functools.wraps(get_fragment)
    def fragment_read_from_file(self, param):
        swapper = _our_swapper(param)
        if swapper is None or param.ds_tensor.status != PartitionedParamStatus.NOT_AVAILABLE:
            return get_fragment(self, param)
        swapper.swap_in([param], async_op=False)
        try:
            return param.ds_tensor.detach().to("cpu", copy=True)
        finally:
            swapper.remove_partition_and_release_buffers([param])

    return fragment_read_from_file


def loading_frozen_fragments_into_files(load_module_state_dict):
    """engine.load_module_state_dict, which copies a checkpoint's frozen fragments into ``param.ds_tensor``: the
    partitions of ours on file are read first, and every frozen partition of ours is marked changed after (its new
    bytes owed to its file: released clean, the old ones would be read again), those read first given back."""
    signature = inspect.signature(load_module_state_dict)

    @functools.wraps(load_module_state_dict)
    def load_into_present_partitions(self, *args, **kwargs):
        checkpoint = signature.bind(self, *args, **kwargs).arguments["checkpoint"]
        frozen = {}  # swapper id -> (swapper, its frozen parameters)
        if checkpoint.get(FROZEN_PARAM_FRAGMENTS) is not None:
            for param in self.module.parameters():
                swapper = None if is_optimized_parameter(param) else _our_swapper(param)
                if swapper is not None:
                    frozen.setdefault(id(swapper), (swapper, []))[1].append(param)
        read = [(swapper, [param for param in params if param.ds_tensor.status == PartitionedParamStatus.NOT_AVAILABLE])
                for swapper, params in frozen.values()]
        for swapper, params in read:
            if params:
                swapper.swap_in(params, async_op=False)
        try:
            return load_module_state_dict(self, *args, **kwargs)
        finally:
            for swapper, params in frozen.values():
                swapper.partitions_rewritten_in_place(params)  # (what the copy reached, if it stopped part way)
            for swapper, params in read:
                if params:
                    swapper.remove_partition_and_release_buffers(params)

    return load_into_present_partitions


def _our_swapper(param):
    swapper = getattr(param, "nvme_swapper", None)
    ok = isinstance(swapper, TencacheParamSwapper) and getattr(param, "ds_tensor", None) is not None
    return swapper if ok else None
