"""DeepSpeed's parameter coordinator with tencache's device tier. Owns: turning the device tier's decisions
(plan/device_tier.py) into DeepSpeed calls — which released parameters stay gathered, which are released instead,
when all are given back — and counting parameter fetches that found their parameter resident.

ZeRO-3 builds its coordinator by module-global name (``parameter_offload.PartitionedParameterCoordinator``), so
install.py rebinds that name to this subclass (deepspeed-integration.md d.3, point 2); nothing is patched. The
subclass is stock until it sees a parameter swapped by tencache in a complete trace: stock engines, and tencache
engines with parameters on the CPU, run DeepSpeed's code unchanged.

The hook is the coordinator's private ``__release_param`` (name-mangled, so a subclass overrides it by its mangled
name): every release — after a module's use, of prefetches at ``reset_step`` — passes through it. Forced releases
(``release_and_reset_all``: checkpoints, ``empty_partition_cache``) and trace invalidation release everything.

Across the optimizer step: stage 3's ``step()`` first partitions every parameter (``_partition_all_parameters``),
then writes the new weights into each partition that is still resident, in place (``_partitioned_params_swap_out``).
install.py routes that one call to ``release_for_optimizer_step``: a kept parameter whose gathered tensor is a view
of its partition (the CPU accelerator at one rank) stays, and is current after the step with no re-fetch; any other
kept parameter is released as stock would, and gathered again (from the host tier) at its next use: one fetch per
parameter per optimizer step, whatever the gradient accumulation.

Ranks agree: which parameters are kept decides which all-gathers run, so the tier's budget is the smallest any rank
proposes (agreement.py), at creation and at every forward pass (memory_pressure.py), and everything else the tier
decides from is the same on every rank (the trace, DeepSpeed asserts; sizes; positions; which parameters are in use).

Counters: every use of a parameter (a module asking for it), the uses that found it gathered without a gather for
them (hits), the bytes every gather produced, and the time spent in fetch_sub_module. Bytes are counted where
DeepSpeed gathers (its private ``__all_gather_params``, the same name-mangled override as above), not at the use:
its prefetch gathers parameters of the modules ahead, which then arrive already gathered, and a use served by a
prefetch is a fetch, not a hit (the first GPU run counted 79% of the bytes and 13 of 28 misses per step when this
was judged at the use). Where a gather is a view of the partition (the CPU accelerator at one rank) nothing is moved
by a gather: the tier is reported as not applicable (stats.py).
"""
import functools
import threading
import time
from typing import Dict, Optional

from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus
from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator, iter_params
from deepspeed.utils import z3_leaf_module

from ...config import AUTO
from ...plan.budget import AUTO_DEVICE_CACHE_FRACTION
from ...probes.limits import local_world_size
from ...plan.device_tier import DeviceTier, device_tier_budget
from ...probes.host_memory import read_host_memory
from ...profile.next_use import NextUseIndex
from .agreement import agree_min, world_size
from .config_bridge import accelerator_is_host, device_free_bytes
from .param_swapper import TencacheParamSwapper

_BASE = PartitionedParameterCoordinator
_MANGLED = "_PartitionedParameterCoordinator__"


class TencacheCoordinator(PartitionedParameterCoordinator):
    """PartitionedParameterCoordinator plus a device tier of gathered parameters kept between uses."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tier: Optional[DeviceTier] = None  # None: stock behaviour
        self.swapper: Optional[TencacheParamSwapper] = None
        self._params_by_id: Dict[int, object] = {}
        self._indexed_order = None  # the trace the tier's index was built from
        self._forcing_release = False
        self._tier_lock = threading.RLock()  # backward hooks may run on autograd's threads
        # COUNTERS (running totals; integrations/deepspeed/stats.py reports them)
        self.param_fetches = 0   # non-persistent parameters asked for by a module (uses), once the tier is on
        self.device_hits = 0     # ... that were gathered already, and not for this use (kept by the tier)
        self.fetch_bytes = 0     # bytes every gather produced (all-gather output / H2D copy), prefetches included
        self.gathers = 0         # ... and how many gathers produced them (each a bucket of parameters)
        self.fetch_s = 0.0       # wall time in fetch_sub_module, once the tier is on
        self._gathered_for_use = set()  # ds_ids gathered since their last use: their next use is no hit

    # ------------------------------------------------------------------------------- DeepSpeed's calls
    def reset_step(self) -> None:
        super().reset_step()
        if self.is_complete_trace() and self._trace_order() is not self._indexed_order:
            self._index_trace()
        if self.tier is not None:
            # stock zeroes its count of gathered numel here, though the tier's residents stay gathered: count them,
            # so that max_live_parameters still bounds what its prefetch gathers on top of them
            setattr(self, _MANGLED + "n_available_params",
                    sum(self._params_by_id[key].ds_numel for key in self.tier.resident_keys()))

    def fetch_sub_module(self, current_submodule, forward: bool) -> None:
        if self.tier is None:
            return super().fetch_sub_module(current_submodule, forward)
        started = time.perf_counter()
        params = [param for param in iter_params(current_submodule, recurse=z3_leaf_module(current_submodule))
                  if not param.ds_persist]
        for param in params:
            self.param_fetches += 1
            if param.ds_status == ZeroParamStatus.AVAILABLE and param.ds_id not in self._gathered_for_use:
                self.device_hits += 1
        try:
            return super().fetch_sub_module(current_submodule, forward)
        finally:
            self._gathered_for_use.difference_update(param.ds_id for param in params)  # this use took them
            self.fetch_s += time.perf_counter() - started

    def _PartitionedParameterCoordinator__all_gather_params(self, params, forward: bool) -> None:
        if self.tier is not None:
            # stock's gather skips the others (gathered already, or in flight): they are not moved
            moved = [param for param in params if param.ds_status == ZeroParamStatus.NOT_AVAILABLE]
            for param in moved:
                self.fetch_bytes += _gathered_bytes(param)
                self._gathered_for_use.add(param.ds_id)
            self.gathers += bool(moved)
        return getattr(_BASE, _MANGLED + "all_gather_params")(self, params, forward)

    def release_and_reset_all(self, module) -> None:
        with self._tier_lock:
            self._forcing_release = True
            try:
                super().release_and_reset_all(module)
            finally:
                self._forcing_release = False
                if self.tier is not None:
                    self.tier.drain()

    def _invalidate_trace(self) -> None:
        # The live sequence left the trace (eval pass, generation, changed control flow): no prediction, so nothing
        # new is kept; the residents stay gathered (current until the optimizer step, which releases them, and used
        # by the eval pass and the re-traced step alike: no fetch again); the next complete trace is indexed afresh.
        super()._invalidate_trace()
        if self.tier is not None:
            self.tier.set_index(None)
            self._indexed_order = None

    def _PartitionedParameterCoordinator__release_param(self, param, free_data: bool = True) -> None:
        if self.tier is None or self._forcing_release:
            return self._release(param, free_data)
        with self._tier_lock:
            keepable = (free_data and param.ds_status == ZeroParamStatus.AVAILABLE and not param.ds_active_sub_modules
                        and not param.ds_persist)
            # positions mean something only in a complete trace; once it was invalidated the tier has no index, and
            # keeps what fits without them (DeviceTier)
            if not keepable or not (self.is_complete_trace() or self.tier.index is None):
                return self._release(param, free_data)
            # a parameter the trace never had (used only in an eval pass) can be kept without a trace
            self._params_by_id.setdefault(param.ds_id, param)
            keep, victims = self.tier.on_release(param.ds_id, _gathered_bytes(param), self._step_id(),
                                                 evictable=self._evictable)
            for key in victims:
                self._release(self._params_by_id[key])
            if not keep:
                self._release(param, free_data)
            elif not self.gathers_alias_partitions and self.is_complete_trace() and not _gathered_is_partition(param):
                # within a traced step only: outside one (after an eval pass) a resident may meet a partitioning
                # that writes into its partition (GatheredParameters with a modifier rank), so it keeps it. Never
                # where the gathered tensor is the partition's memory (a ZeRO group of one rank inside a larger
                # world on a host accelerator: the world size said otherwise; helper-221), which a give-back would
                # hand another partition's read while the tier serves it
                _give_back_partition(param, getattr(self, _MANGLED + "allgather_stream"))

    # ------------------------------------------------------------------------------- our hooks
    def release_for_optimizer_step(self, module) -> None:
        """``release_and_reset_all`` for stage 3's step(): the same, except that kept parameters whose gathered
        tensor is their partition stay gathered (the step updates them in place)."""
        if self.tier is None:
            return self.release_and_reset_all(module)
        with self._tier_lock:
            stay = {key for key in self.tier.resident_keys() if _gathered_is_partition(self._params_by_id[key])}
            registry = getattr(self, _MANGLED + "inflight_param_registry")
            for param in iter_params(module, recurse=True):
                if param in registry:
                    registry.pop(param).wait()
                param.ds_active_sub_modules.clear()
                if param.ds_id not in stay:
                    self._release(param)
            for param in iter_params(module, recurse=True):
                if param.ds_id not in stay and param.ds_status != ZeroParamStatus.NOT_AVAILABLE:
                    raise RuntimeError(f"{param.ds_summary()} expected to be released")

    @property
    def gathers_alias_partitions(self) -> bool:
        """A gathered parameter is a view of its partition (the CPU accelerator at one rank): a gather moves no
        bytes, and a kept parameter holds the host tier's own buffer."""
        return accelerator_is_host() and world_size() == 1

    def propose_device_budget(self, host_param_capacity_bytes: Optional[int] = None,
                              step_rise_bytes: int = 0) -> int:
        """This rank's device-tier budget from its readings now (ranks agree on the smallest: the caller's job).
        ``host_param_capacity_bytes``: the parameters' host-tier capacity after a resize about to happen (default:
        now); ``step_rise_bytes``: how far a step rises in host memory (used where the gathered parameters are
        host memory of their own: the CPU accelerator at several ranks)."""
        if self.swapper is None:
            return 0
        aliasing = self.gathers_alias_partitions
        capacity, free, rise = 0, 0, 0
        if aliasing:  # the tier is carved out of the parameters' host capacity
            capacity = self.swapper.host_param_capacity() if host_param_capacity_bytes is None \
                else host_param_capacity_bytes
        elif self.swapper.config.device_cache_bytes != AUTO:
            pass  # a size given is the budget: nothing to read (device_tier_budget)
        elif accelerator_is_host():  # the all-gather's output is this rank's share of the node's available memory
            free, rise = read_host_memory().available_bytes // local_world_size(), step_rise_bytes
        else:
            accelerator = get_accelerator()
            free = device_free_bytes(accelerator)
            # the highest any step has risen above the level between steps: its activations and temporaries
            rise = max(0, int(accelerator.max_memory_allocated()) - int(accelerator.memory_allocated()))
        resident = self.tier.resident_bytes if self.tier is not None else 0
        return device_tier_budget(self.swapper.config.device_cache_bytes, aliasing, capacity, free,
                                  AUTO_DEVICE_CACHE_FRACTION, resident_bytes=resident, step_peak_rise_bytes=rise)

    def apply_device_budget(self, budget_bytes: int) -> None:
        """Refit the tier to a budget every rank agreed on: release the residents that no longer fit, farthest next
        use first (the same ones on every rank: the choice depends only on rank-invariant inputs). Called before the
        host store gives back slots that kept partitions hold."""
        if self.tier is None:
            return
        with self._tier_lock:
            self._release_keys(self.tier.resize(budget_bytes, self._step_id(), self._evictable))

    def device_cache_bytes_in_use(self) -> int:
        return self.tier.resident_bytes if self.tier is not None else 0

    def device_cache_peak_bytes(self) -> int:
        """The most the tier held since ``restart_device_peak`` (the last optimizer step's end)."""
        return self.tier.peak_resident_bytes if self.tier is not None else 0

    def restart_device_peak(self) -> None:
        """An optimizer step ended (reporting.py read its peak): the next one's starts from what is held now."""
        with self._tier_lock:
            if self.tier is not None:
                self.tier.restart_peak()

    # ------------------------------------------------------------------------------- private
    def _release(self, param, free_data: bool = True) -> None:
        if self.tier is not None:
            self.tier.forget(param.ds_id)
        getattr(_BASE, _MANGLED + "release_param")(self, param, free_data)

    def _release_keys(self, keys) -> None:
        for key in keys:
            param = self._params_by_id[key]
            if param.ds_status == ZeroParamStatus.AVAILABLE and not param.ds_active_sub_modules:
                self._release(param)
            elif self.tier is not None:
                self.tier.forget(key)

    def _evictable(self, key) -> bool:
        param = self._params_by_id[key]
        return param.ds_status == ZeroParamStatus.AVAILABLE and not param.ds_active_sub_modules

    def _step_id(self) -> int:
        return getattr(self, _MANGLED + "step_id")

    def _trace_order(self):
        return getattr(self, _MANGLED + "param_order")

    def _index_trace(self) -> None:
        """Build the device tier's next-use index from the coordinator's complete trace: parameter -> the module
        steps that use it, in a step of len(submodule order) module steps."""
        order = self._trace_order()
        self._indexed_order = order
        swapper = next((entry.param.nvme_swapper for entry in order
                        if isinstance(getattr(entry.param, "nvme_swapper", None), TencacheParamSwapper)), None)
        if swapper is None:
            return
        with self._tier_lock:
            if self.tier is None:
                self.swapper = swapper
                # (the step's rise as the governor last expected it: made here, between its refits, a tier sized
                # without it took the room the step needs: helper-218)
                self.tier = DeviceTier(agree_min([self.propose_device_budget(
                    step_rise_bytes=getattr(self, "step_rise_hint_bytes", 0))])[0])
            positions: Dict[int, list] = {}
            for entry in order:
                positions.setdefault(entry.param.ds_id, []).append(entry.step_id_last_used_at)
                self._params_by_id[entry.param.ds_id] = entry.param
            steps = len(getattr(self, _MANGLED + "submodule_order"))
            self.tier.set_index(NextUseIndex.from_positions(positions, steps))


def _give_back_partition(param, gather_stream=None) -> None:
    """A kept parameter whose gathered tensor is memory of its own (a GPU; the CPU accelerator at several ranks) has
    no use for its host partition until the optimizer step, which releases it first: the partition's slot goes back
    to the host tier now, for DeepSpeed's prefetch of the parameters it will need and for the store's cache. The
    bytes are unchanged (only the optimizer step changes them) and stay in the host tier or on file. The slot is
    reused only after the copies on ``gather_stream`` (the coordinator's all-gather stream, None where the device
    is synchronised): a gather in flight at reset_step is waited for on the current stream alone."""
    partition = param.ds_tensor
    if (partition is not None and isinstance(getattr(param, "nvme_swapper", None), TencacheParamSwapper)
            and getattr(partition, "final_location", None) == OffloadDeviceEnum.nvme
            and partition.status == PartitionedParamStatus.AVAILABLE):
        param.nvme_swapper.remove_partition_and_release_buffers([param], copies_on=gather_stream)


def restoring_kept_partitions(ensure_availability):
    """Init._ensure_availability_of_partitioned_params, which every gather DeepSpeed makes runs first (its
    coordinator's, and GatheredParameters' from user code, a 16-bit save, a checkpoint), for parameters the device
    tier keeps gathered after giving their partition back (``_give_back_partition``). DeepSpeed asserts that a
    partition away on NVMe belongs to a parameter that is not gathered. Such a partition is read back first (its
    bytes are unchanged since the optimizer step), the state the parameter had before it gave it back: the gather
    then skips it (it is gathered), and a GatheredParameters context partitions it at its exit as any other.

    Where: a kept parameter meets an outside gather between a traced step's release and the optimizer step, or
    after an evaluation pass that followed the trace (a frozen base model's weights gathered after its last eval:
    both ranks stopped on DeepSpeed's assertion)."""
    @functools.wraps(ensure_availability)
    def ensure_availability_restoring_kept(self, params):
        kept = [param for param in params
                if param.ds_status != ZeroParamStatus.NOT_AVAILABLE and param.ds_tensor is not None
                and param.ds_tensor.status == PartitionedParamStatus.NOT_AVAILABLE
                and isinstance(getattr(param, "nvme_swapper", None), TencacheParamSwapper)]
        if kept:
            kept[0].nvme_swapper.swap_in(kept, async_op=False)
        return ensure_availability(self, params)

    return ensure_availability_restoring_kept


def _gathered_bytes(param) -> int:
    """The bytes of ``param`` gathered: its full size in its own dtype. Not the partition's element size: a partition
    swapped out to NVMe holds a one-element placeholder (the swapper's ``invalid_buffer``; DeepSpeed's own is fp16,
    which made an fp32 parameter count half its bytes)."""
    return param.ds_numel * param.element_size()


def _gathered_is_partition(param) -> bool:
    """True when the gathered tensor shares memory with the partition (one rank, device = host memory)."""
    if param.ds_status != ZeroParamStatus.AVAILABLE or param.ds_tensor is None:
        return False
    return param.data.untyped_storage().data_ptr() == param.ds_tensor.data.untyped_storage().data_ptr()



def coordinator_of(optimizer) -> Optional[TencacheCoordinator]:
    """The ZeRO-3 optimizer's coordinator when it is ours."""
    offload = getattr(optimizer, "parameter_offload", None)
    coordinator = offload.get_param_coordinator() if offload is not None else None
    return coordinator if isinstance(coordinator, TencacheCoordinator) else None
