"""DeepSpeed's optimizer swapper over tencache's buffer pool and I/O engine. Owns: construction (config lookup,
stock fallback) and the buffer manager; the swapping logic is DeepSpeed's own (PartitionedOptimizerSwapper and
OptimizerSwapper), run unchanged through AioHandleAdapter, so optimizer math and file layout are stock.

What changes for users:
- The fp32 master weights, Adam moments and gradients of a sub-group are only ever touched by the CPU optimizer
  and by file I/O, never by the accelerator, so their buffers are 4 KiB-aligned *pageable* memory: stock locks
  `buffer_count x largest sub-group x 4 B` (a gigabyte or more) only because its I/O engine bounces anything it
  did not lock itself.
- A shortage of buffers (stock: `assert pinned_buffers is not None`, or "PipelinedOptimizerSwapper ran out of
  swap buffers" below 12 buffers) takes more pageable memory instead of failing.
"""
import os

import torch
from deepspeed.runtime.swap_tensor.async_swapper import AsyncTensorSwapper
from deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper import PartitionedOptimizerSwapper
from deepspeed.runtime.swap_tensor.pipelined_optimizer_swapper import PipelinedOptimizerSwapper
from deepspeed import comm as dist

from ...config import parse_config, CONFIG_KEY
from ...cache.file_cache import FileCache
from ...cache.host_budget import HostBudget
from ...io.direct_io import DirectFileIO
from ...plan.budget import MachineResources, resolve_budgets
from ...memory.pool import BufferPool
from .aio_adapter import AioHandleAdapter
from .profiling import ProfiledOrder, rank_profile_path
from .config_bridge import MIN_SWAPPABLE_BYTES, find_stage3_ds_config, io_aligned_numel, prepare_swap_folder
from . import param_swapper, reporting

NVME_PATH_KEY = "zero_optimization.offload_optimizer.nvme_path"
# Adam needs the fp32 param, two moments and the gradient of one sub-group at once (deepspeed-integration.md a.7).
MIN_BUFFERS = 4


class PoolSwapBufferManager:
    """DeepSpeed's SwapBufferManager interface (allocate / allocate_all / free) over a BufferPool. Buffers hold
    ``num_elems`` elements (the largest sub-group); ``allocate`` never returns None."""

    def __init__(self, num_elems: int, count: int, dtype: torch.dtype, pool: BufferPool):
        self.num_elems = num_elems
        self.count = count
        self.dtype = dtype
        self._nbytes = num_elems * torch.empty((), dtype=dtype).element_size()
        self._pool = pool
        self._pool.add_classes({self._nbytes: count})
        self._lent = {}  # id(view handed out) -> HostBuffer; DeepSpeed frees by the same view objects

    def allocate(self, num_elems, count, dtype):
        if dtype != self.dtype or num_elems > self.num_elems:
            raise ValueError(f"buffer request {count} x {num_elems} {dtype} exceeds {self.num_elems} {self.dtype}")
        views = []
        for _ in range(count):
            buffer = self._pool.acquire(self._nbytes)
            view = buffer.view(self.dtype, self.num_elems).narrow(0, 0, num_elems)
            self._lent[id(view)] = buffer
            views.append(view)
        return views

    def allocate_all(self, num_elems, dtype):
        # Stock lends every free buffer (gradient staging, initialisation); at least one keeps them moving.
        return self.allocate(num_elems=num_elems, count=max(1, self._pool.free_slots()), dtype=dtype)

    def free(self, buffers):
        for view in buffers:
            self._pool.release(self._lent.pop(id(view)))


class TencacheOptimizerSwapper(PartitionedOptimizerSwapper):
    """Stands in for both PartitionedOptimizerSwapper and PipelinedOptimizerSwapper in stage3's namespace."""

    def __new__(cls, swap_config, aio_config, base_folder, optimizer, largest_numel, device, dtype, timers):
        raw = find_stage3_ds_config()
        config = parse_config(raw.get(CONFIG_KEY) if isinstance(raw, dict) else None)
        if not config.enabled:
            stock = PipelinedOptimizerSwapper if swap_config.pipeline else PartitionedOptimizerSwapper
            return stock(swap_config=swap_config, aio_config=aio_config, base_folder=base_folder,
                         optimizer=optimizer, largest_numel=largest_numel, device=device, dtype=dtype, timers=timers)
        swapper = super().__new__(cls)
        swapper.config = config
        return swapper

    def __init__(self, swap_config, aio_config, base_folder, optimizer, largest_numel, device, dtype, timers):
        # pylint: disable=super-init-not-called
        # The stock constructors lock buffer_count x largest_numel through DeepSpeed's aio handle; everything
        # else they set up is reproduced here, with our engine in place of the handle.
        intra_op = int(aio_config.get("intra_op_parallelism", 1))
        self.swap_config = swap_config
        self.aio_config = aio_config
        self.swap_params_info = {}
        self.swap_element_size = torch.empty((), dtype=dtype).element_size()
        self.swap_folder = os.path.join(base_folder, "optimizer", f"rank{dist.get_rank()}")
        prepare_swap_folder(self.swap_folder, swap_config.nvme_path, NVME_PATH_KEY)
        self.optimizer = optimizer
        self.min_aio_bytes = max(MIN_SWAPPABLE_BYTES, int(aio_config.get("block_size", 0)))
        self.aligned_bytes = 1024 * intra_op
        self.numel_alignment = self.aligned_bytes // self.swap_element_size
        self.largest_numel = io_aligned_numel(largest_numel, dtype, intra_op)
        self.dtype = dtype
        self.io = DirectFileIO(num_threads=max(2, intra_op), name="tencache-optim-io")
        self.pool = BufferPool("optimizer", lock="off")
        self.file_cache = self._make_file_cache()
        # The optimizer's swap files are read in the same order every step. log_timers() ends each step; the
        # first call ends initialisation, the second the first training step.
        self.profile = ProfiledOrder(rank_profile_path(self.config.profile_path), "optimizer",
                                     training_step_index=1, to_file=os.path.basename,
                                     from_file=lambda name: os.path.join(self.swap_folder, name))
        self.aio_handle = AioHandleAdapter(self.io, self.pool, self.file_cache)
        self.swap_buffer_manager = PoolSwapBufferManager(self.largest_numel, max(MIN_BUFFERS, swap_config.buffer_count),
                                                         dtype, self.pool)
        self.gradient_swapper = AsyncTensorSwapper(aio_handle=self.aio_handle, numel_alignment=self.numel_alignment,
                                                   timers=timers)
        self.timers = timers
        self.timer_names = set()
        self._profile_looked_up = False
        self._started = False  # a backward has begun: log_timers() calls from now on end training steps
        self.print_exclude_list = ["optimizer", "swap_buffer_manager", "swap_params_info", "timers", "timer_names",
                                   "aio_handle", "gradient_swapper", "print_exclude_list", "io", "pool", "config"]

    def _make_file_cache(self):
        """The host cache's share left after the parameter cache (planned now, so the split is deterministic:
        parameters first, as each cached parameter byte saves a read in forward and one in backward)."""
        budgets = resolve_budgets(self.config, MachineResources.probe())
        param_reserved = 0
        for swapper in param_swapper.live_swappers():
            swapper.plan()
            param_reserved += swapper.store.cache_bytes_reserved
        remaining = budgets.host_cache_bytes - param_reserved
        if remaining <= 0:
            return None
        # DeepSpeed never copies gradient fragments into checkpoints: those are written back, not through.
        return FileCache(HostBudget(remaining), self.io, write_back=lambda path: "_gradient_" in os.path.basename(path))

    def purge_state(self):
        # Checkpoint load: DeepSpeed replaces the swap files and forgets its state; so do we.
        super().purge_state()
        if self.file_cache is not None:
            self.file_cache.clear()

    # ------------------------------------------------------------------ step boundaries: logging, metrics
    def pre_backward(self):
        super().pre_backward()
        if not self._started:
            self._started = True
            reporting.log_startup_stats(param_swapper.live_swappers(), self)

    def log_timers(self):
        # DeepSpeed calls this at the end of every optimizer step (stage3 _post_step), and once after building
        # the optimizer states, before the first backward: that one is not a training step.
        super().log_timers()
        if self.file_cache is not None:
            if not self._profile_looked_up:  # the first call ends initialisation: every sub-group is known
                self._profile_looked_up = True
                self.file_cache.next_use = self.profile.load(
                    sorted((key, info.numel()) for key, info in self.swap_params_info.items()), str(self.dtype),
                    dist.get_world_size())
            self.file_cache.next_use = self.profile.end_step(self.file_cache.recorder.end_step())
        if self._started:
            reporting.write_step_metrics(self.config, param_swapper.live_swappers(), self)

    # Stock PipelinedOptimizerSwapper has no default for async_parameter; the Muon path calls without it.
    def swap_in_optimizer_state(self, parameter, async_parameter=None):
        return super().swap_in_optimizer_state(parameter, async_parameter=async_parameter)

    def swap_out_optimizer_state(self, parameter, async_swap=False):
        return super().swap_out_optimizer_state(parameter, async_swap=async_swap)

    def initialize_from_swapped_fp16_params(self, fp16_partitions_info, fp16_num_elems, fp16_pinned_buffers,
                                            fp32_parameters):
        """offload_optimizer.fast_init: build each fp32 master file straight from the fp16 partitions (in memory
        or in the param swapper's files) without the lent staging buffers stock needs."""
        fp32_paths = self._get_swap_paths(parameters=fp32_parameters, num_elems=fp16_num_elems)
        for partitions, numel, fp32_path in zip(fp16_partitions_info, fp16_num_elems, fp32_paths):
            [fp32_view] = self.swap_buffer_manager.allocate(num_elems=self._io_aligned_numel(numel), count=1,
                                                            dtype=self.dtype)
            offset = 0
            for tensor, partition_numel, path in partitions:
                destination = fp32_view.narrow(0, offset, partition_numel)
                if path is None:
                    destination.copy_(tensor.data)
                else:
                    low = torch.empty(partition_numel, dtype=param_swapper.dtype_of_swap_file(path))
                    self.io.read(low, path).result()
                    destination.copy_(low)
                offset += partition_numel
            self.io.write(fp32_view, fp32_path).result()
            self.swap_buffer_manager.free([fp32_view])

    def stats(self) -> dict:
        counters = self.io.counters()
        stats = {f"optimizer_{key}": value for key, value in self.pool.stats().items()}
        stats["optimizer_profile"] = self.profile.source
        if self.file_cache is not None:
            stats.update({f"optimizer_cache_{key}": value for key, value in self.file_cache.stats().items()})
        stats.update(optimizer_nvme_read_bytes=counters.read_bytes, optimizer_nvme_write_bytes=counters.write_bytes,
                     stock_optimizer_pinned_bytes_estimate=self.stock_pinned_bytes_estimate())
        return stats

    def stock_pinned_bytes_estimate(self) -> int:
        """SwapBufferManager's lock: buffer_count buffers of the largest sub-group (optimizer_utils.py)."""
        return int(self.swap_config.buffer_count) * self.largest_numel * self.swap_element_size
