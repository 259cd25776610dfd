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
kept parameter is released as stock would, and gathered again (from the host tier) at its next use.
"""
import threading
import time
from typing import Dict, Optional

from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator, iter_params
from deepspeed.utils import z3_leaf_module

from ...plan.budget import AUTO_DEVICE_CACHE_FRACTION
from ...plan.device_tier import DeviceTier, device_tier_budget
from ...profile.next_use import NextUseIndex
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
        self.param_fetches = 0   # non-persistent parameters asked for by a module, once the tier is on
        self.device_hits = 0     # ... that were already gathered (no swap-in, no all-gather)
        self.fetch_s = 0.0       # wall time in fetch_sub_module, once the tier is on

    # ------------------------------------------------------------------------------- DeepSpeed's calls
    def reset_step(self) -> None:
        super().reset_step()
        if self.is_complete_trace() and self._trace_order() is not self._indexed_order:
            self._index_trace()

    def fetch_sub_module(self, current_submodule, forward: bool) -> None:
        if self.tier is None:
            return super().fetch_sub_module(current_submodule, forward)
        started = time.perf_counter()
        for param in iter_params(current_submodule, recurse=z3_leaf_module(current_submodule)):
            if not param.ds_persist:
                self.param_fetches += 1
                self.device_hits += param.ds_status == ZeroParamStatus.AVAILABLE
        try:
            return super().fetch_sub_module(current_submodule, forward)
        finally:
            self.fetch_s += time.perf_counter() - started

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
        # The live sequence left the trace (eval pass, generation, changed control flow): no prediction, so no
        # retention; the next complete trace is indexed afresh.
        super()._invalidate_trace()
        if self.tier is not None:
            self._release_keys(self.tier.set_index(None))
            self._indexed_order = None

    def _PartitionedParameterCoordinator__release_param(self, param, free_data: bool = True) -> None:
        if self.tier is None or self._forcing_release:
            return self._release(param, free_data)
        with self._tier_lock:
            if not (free_data and self.is_complete_trace() and param.ds_status == ZeroParamStatus.AVAILABLE
                    and not param.ds_active_sub_modules and not param.ds_persist):
                return self._release(param, free_data)
            keep, victims = self.tier.on_release(param.ds_id, _gathered_bytes(param), self._step_id(),
                                                 evictable=self._evictable)
            for key in victims:
                self._release(self._params_by_id[key])
            if not keep:
                self._release(param, free_data)

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

    def resize_device_tier(self, host_param_capacity_bytes: int) -> None:
        """The parameters' share of the host tier changed (memory pressure). Where the device is host memory the
        tier is carved from that share: refit its budget, and release the residents that no longer fit (before
        the parameter store gives their slots back). On an accelerator its budget is not host memory: unchanged."""
        if self.tier is None or self.swapper is None or not _device_is_host():
            return
        with self._tier_lock:
            budget = _device_budget(self.swapper, host_param_capacity_bytes)
            self._release_keys(self.tier.resize(budget, self._step_id(), self._evictable))

    def device_cache_bytes_in_use(self) -> int:
        return self.tier.resident_bytes if self.tier is not None else 0

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
                self.tier = DeviceTier(_device_budget(swapper))
            positions: Dict[int, list] = {}
            for entry in order:
                positions.setdefault(entry.param.ds_id, []).append(entry.step_id_last_used_at)
                self._params_by_id[entry.param.ds_id] = entry.param
            steps = len(getattr(self, _MANGLED + "submodule_order"))
            self._release_keys(self.tier.set_index(None))
            self.tier.set_index(NextUseIndex.from_positions(positions, steps))


def _gathered_bytes(param) -> int:
    return param.ds_numel * param.ds_tensor.element_size()


def _gathered_is_partition(param) -> bool:
    """True when the gathered tensor shares memory with the partition (one rank, device = host memory)."""
    if param.ds_status != ZeroParamStatus.AVAILABLE or param.ds_tensor is None:
        return False
    return param.data.untyped_storage().data_ptr() == param.ds_tensor.data.untyped_storage().data_ptr()


def _device_is_host() -> bool:
    return get_accelerator().device_name() == "cpu"


def _device_budget(swapper: TencacheParamSwapper, host_param_capacity_bytes: Optional[int] = None) -> int:
    device_is_host = _device_is_host()
    device_free = 0 if device_is_host else int(get_accelerator().available_memory())
    capacity = swapper.host_param_capacity() if host_param_capacity_bytes is None else host_param_capacity_bytes
    return device_tier_budget(swapper.config.device_cache_bytes, device_is_host, capacity, device_free,
                              AUTO_DEVICE_CACHE_FRACTION)


def coordinator_of(optimizer) -> Optional[TencacheCoordinator]:
    """The ZeRO-3 optimizer's coordinator when it is ours."""
    offload = getattr(optimizer, "parameter_offload", None)
    coordinator = offload.get_param_coordinator() if offload is not None else None
    return coordinator if isinstance(coordinator, TencacheCoordinator) else None
