"""Run by test_one_rank_reduce.py in a process of its own (it starts a one-rank gloo group): stage 3's
reduce_scatter_coalesced as tencache installs it, marked for a tencache optimizer and not, against DeepSpeed's own
function, on the bucket shapes stage 3 hands it. Prints RESULT {json}."""
import contextlib
import json
import os

import torch
import deepspeed
import deepspeed.comm as dist
import deepspeed.runtime.zero.stage3 as stage3
from deepspeed.runtime.comm.coalesced_collectives import reduce_scatter_coalesced as deepspeeds

import tencache_ds  # noqa: F401  (installs the rebinding)
from tencache_ds.integrations.deepspeed import one_rank_reduce
from tencache_ds.integrations.deepspeed.memory_pressure import GOVERNOR_ATTRIBUTE
from tencache_ds.integrations.deepspeed.one_rank_reduce import (gradients_partitioned_at_once,
                                                                marking_tencache_reductions,
                                                                partitioning_each_gradient_at_once,
                                                                partitions_each_gradient_at_once, reduces_to_views,
                                                                reductions_without_copy)


class Optimizer:
    """Stands for a ZeRO-3 optimizer; ``tencache``: one tencache swaps for (its host governor attached)."""

    def __init__(self, tencache):
        self.reduce_scatter = True
        if tencache:
            setattr(self, GOVERNOR_ATTRIBUTE, object())


class Group:
    """A partition group of ``ranks`` ranks, for the functions that ask its size (``group_sizes``)."""

    def __init__(self, ranks):
        self.ranks = ranks


@contextlib.contextmanager
def group_sizes():
    """deepspeed.comm's get_world_size answers a ``Group`` by its ranks (one process cannot make a group of two)."""
    real = one_rank_reduce.dist.get_world_size
    one_rank_reduce.dist.get_world_size = lambda group=None: group.ranks if isinstance(group, Group) else real(group)
    try:
        yield
    finally:
        one_rank_reduce.dist.get_world_size = real


class Stage3:
    """What reduces_to_views reads of a built ZeRO-3 optimizer: reduce_scatter, its parameters and their groups."""

    def __init__(self, reduce_scatter, ranks=None):
        self.reduce_scatter = reduce_scatter
        self.fp16_groups = [[torch.empty(3), torch.empty(5)]]
        self.group = None if ranks is None else Group(ranks)

    def _get_param_partition_group(self, param):
        return self.group  # None: the world, one rank here


class Adding(Optimizer):
    """Stands for a ZeRO-3 optimizer a gradient is added to a bucket of: its model dtype, one bucket of its
    communication dtype, and the flush, which notes the bucket's gradients' dtypes and empties it."""

    def __init__(self, tencache, dtype, comm_dtype, reduce_scatter=True, zenflow=False):
        super().__init__(tencache)
        self.reduce_scatter, self.zenflow = reduce_scatter, zenflow
        self.dtype, self.comm_dtype = dtype, comm_dtype
        self.ipg_buckets = {comm_dtype: stage3.IPGBucketZ3()}
        self.flushed = []

    def get_param_comm_dtype(self, param):
        return self.comm_dtype

    def _get_param_partition_group(self, param):
        return None  # the world: one rank here

    def _DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads(self, comm_dtype):
        bucket = self.ipg_buckets[comm_dtype]
        self.flushed.append((len(bucket.params), bucket.elements))
        bucket.clear_params()


def deepspeeds_add(self, param):
    """Stands for stage 3's __add_grad_to_ipg_bucket: notes that the gradient went DeepSpeed's way."""
    self.flushed.append("deepspeed's add")


def added(optimizer, grad_dtype):
    """What became of one gradient of ``grad_dtype`` added through tencache's wrapper."""
    param = torch.nn.Parameter(torch.zeros(6, dtype=grad_dtype))
    param.grad = torch.ones(6, dtype=grad_dtype)
    partitioning_each_gradient_at_once(deepspeeds_add)(optimizer, param)
    return {"flushed": optimizer.flushed, "counted": gradients_partitioned_at_once(optimizer)}


def avg_scatter_grads(self, tensors):
    return stage3.reduce_scatter_coalesced(tensors, None)  # as __avg_scatter_grads calls it, by the module's name


def bits(tensors):
    return [t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32).tolist() for t in tensors]


def main():
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    deepspeed.init_distributed(dist_backend="gloo")
    assert dist.get_world_size() == 1
    marked = marking_tencache_reductions(avg_scatter_grads)
    generator = torch.Generator().manual_seed(0)
    buckets = {
        "one tensor": [torch.randn(1000, generator=generator)],
        "several, odd lengths": [torch.randn(n, generator=generator) for n in (7, 1000, 33)],
        "bf16 matrices": [torch.randn(r, c, generator=generator).to(torch.bfloat16) for r, c in ((16, 8), (3, 5))],
        # where dividing by one could change bits, if anywhere: signed zeros, infinities, NaNs, subnormals
        "special values": [torch.tensor([-0.0, 0.0, float("inf"), -float("inf"), float("nan"), -float("nan"),
                                         1e-45, -3e-39, 3.0]), torch.tensor([float("nan"), -0.0])],
    }
    result = {}
    for name, bucket in buckets.items():
        expected = deepspeeds([t.clone() for t in bucket], None)
        inputs = [t.clone() for t in bucket]
        tencache = Optimizer(tencache=True)
        ours = marked(tencache, inputs)
        stock_optimizer = Optimizer(tencache=False)
        unmarked = marked(stock_optimizer, [t.clone() for t in bucket])
        result[name] = {
            "same_bits": bits(ours) == bits(expected) and bits(unmarked) == bits(expected),
            "shapes": [list(t.shape) for t in ours] == [list(t.shape) for t in expected],
            "views_of_inputs": [o.data_ptr() == i.data_ptr() for o, i in zip(ours, inputs)],
            "inputs_unchanged": bits(inputs) == bits(bucket),
            "counted": [reductions_without_copy(tencache), reductions_without_copy(stock_optimizer)],
        }
    # a tencache optimizer without reduce_scatter reaches __avg_scatter_grads only for a bucket over its size:
    # DeepSpeed's path, as the governor's reserve assumes
    without = Optimizer(tencache=True)
    without.reduce_scatter = False
    marked(without, [t.clone() for t in buckets["one tensor"]])
    result["without_reduce_scatter_counted"] = reductions_without_copy(without)
    # which built optimizers take views: reduce_scatter on (a one-rank group, the CPU accelerator); off, stage 3
    # all-reduces its contiguous bucket instead
    result["reduces_to_views"] = [reduces_to_views(Stage3(reduce_scatter=True)),
                                  reduces_to_views(Stage3(reduce_scatter=False))]
    with group_sizes():  # and which partition each gradient at once: groups of one or two ranks
        result["partitions_at_once"] = [partitions_each_gradient_at_once(Stage3(reduce_scatter=True)),
                                        partitions_each_gradient_at_once(Stage3(reduce_scatter=False)),
                                        partitions_each_gradient_at_once(Stage3(True, ranks=2)),
                                        partitions_each_gradient_at_once(Stage3(True, ranks=3))]
        result["views_at_two_ranks"] = reduces_to_views(Stage3(True, ranks=2))
    # each gradient partitioned at once, alone, where its reduce takes views and the bucket's copy changes no value
    f32, bf16 = torch.float32, torch.bfloat16
    result["added"] = {
        "fp32 model and gradient": added(Adding(True, f32, f32), f32),
        "bf16 gradient, fp32 communication": added(Adding(True, bf16, f32), bf16),  # cast by __avg_scatter_grads
        "fp32 gradient, bf16 model and communication": added(Adding(True, bf16, bf16), f32),  # the copy would cast
        "stock optimizer": added(Adding(False, f32, f32), f32),
        "without reduce_scatter": added(Adding(True, f32, f32, reduce_scatter=False), f32),
        "zenflow": added(Adding(True, f32, f32, zenflow=True), f32),
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
