"""Optimizer state of one rank: wraps an EntryStore (cache/entry_store.py) whose buffers are budgeted pageable
memory (cache/buffer_sources.py ``BudgetedPageable``). Owns: the streaming slots sub-groups the tier does not hold
stream through, this store's share of the host tier, and the footprint arithmetic memory pressure works with (what
the tier holds now, the least it can hold, resizing it). Does not own: entry states, I/O, eviction (the EntryStore,
whose calls it forwards: ``FORWARDED``), what a sub-group is or when it is used (DeepSpeed, through
integrations/deepspeed/optimizer_swapper.py, which gives the sub-groups' sizes and lists their tensors).

Plain class: imports torch, not DeepSpeed.
"""
from typing import Callable, Iterable

import torch

from ..io.direct_io import DirectFileIO
from ..memory.pool import BufferPool
from ..plan.host_tier import (OPTIMIZER_BYTES_PER_ELEMENT, OPTIMIZER_IO_BYTES_PER_HELD_BYTE,
                              OPTIMIZER_STREAMING_SLOTS, PARAM_IO_BYTES_PER_HELD_BYTE, TierDemand, split_host_budget,
                              streaming_tensors_at_once)
from ..units import HOST_PAGE_BYTES, arena_page_bytes, round_up
from .buffer_sources import BudgetedPageable
from .entry_store import EntryStore
from .entry_store_wrapper import EntryStoreWrapper
from .host_budget import HostBudget


def optimizer_tier_share(host_cache_bytes: int, param_cache_bytes: int, param_elements: int) -> int:
    """The optimizer's bytes of a host tier of ``host_cache_bytes``: what the split by I/O saved per byte
    (plan/host_tier.py) leaves after the parameter partitions' ``param_cache_bytes`` of cache slots. Its demand is
    every sub-group's state (``param_elements`` elements), at least the whole tier."""
    shares = split_host_budget(host_cache_bytes, [
        TierDemand("params", param_cache_bytes, PARAM_IO_BYTES_PER_HELD_BYTE),
        TierDemand("optimizer", max(param_elements * OPTIMIZER_BYTES_PER_ELEMENT, host_cache_bytes),
                   OPTIMIZER_IO_BYTES_PER_HELD_BYTE)])
    return shares["optimizer"]


class OptimizerStore(EntryStoreWrapper):
    """Files plus budgeted host buffers for the optimizer's sub-group tensors (master, optimizer state, gradient)
    in the masters' dtype; a narrower state in its own bytes (cache/state_dtype.py).

    Args:
        dtype: the masters' element type, in which every buffer and slot is sized.
        aligned_numel: rounds a numel up to the I/O alignment; files and buffers use the rounded length.
        io: the I/O engine.
        largest_numel: the largest sub-group's elements (aligned): the size of a streaming slot.
        streaming_slots: how many (at least ``OPTIMIZER_STREAMING_SLOTS``).
        host_tier_share: this store's bytes of the host tier, asked once the streaming slots are set up.
    """

    # The EntryStore calls the optimizer swapper and the checkpoint code make, forwarded as they are.
    FORWARDED = frozenset({
        "add", "knows", "state", "kept", "path", "numels", "swap_nbytes", "lend", "lend_copied", "copyable", "lend_new",
        "start_read", "prefetch_if_free", "read_from_copies",
        "wait_read", "release", "release_rewritten_elsewhere", "mark_changed", "write_parts", "flush", "flush_key",
        "wait_writes", "reap_writes", "held_keys",
        "forget", "discard", "forget_all", "trim_kept", "stats", "check_invariants", "recorder", "counters"})

    def __init__(self, dtype: torch.dtype, aligned_numel: Callable[[int], int], io: DirectFileIO,
                 largest_numel: int, streaming_slots: int, host_tier_share: Callable[[], int]):
        self.element_size = torch.empty((), dtype=dtype).element_size()
        self.pool = BufferPool("optimizer", lock="off")
        # Streaming slots for sub-groups the host tier does not hold: reused between steps, never locked. Adam
        # needs the master, two moments and the gradient of one sub-group at once (deepspeed-integration.md a.7),
        # as many for the next sub-group, read ahead meanwhile, and the last one's changed tensors keep theirs until
        # written (plan/host_tier.streaming_tensors_at_once); beyond the slots an update waits for a write. They
        # start retired (no memory) and come back one by one as a tensor first has to stream
        # (BudgetedPageable.fallback): a tier that holds everything never commits them, and one that holds
        # everything again gives them back (resize_host_footprint).
        # its size class, in the arena's pages (units.arena_page_bytes)
        self.streaming_slot_bytes = round_up(largest_numel * self.element_size, arena_page_bytes())
        streaming_slots = max(OPTIMIZER_STREAMING_SLOTS, int(streaming_slots))
        self.pool.add_classes({self.streaming_slot_bytes: streaming_slots}, too_large_remedy=(
            f"each of the {streaming_slots} slots holds one tensor of the largest optimizer sub-group "
            f"({largest_numel} elements): lower zero_optimization.sub_group_size, or free host memory"))
        self.pool.retire_free(self.streaming_slot_bytes, streaming_slots)
        self.budget = HostBudget(host_tier_share())
        super().__init__(EntryStore("optimizer", dtype, aligned_numel, io, BudgetedPageable(self.pool, self.budget)))

    # ---------------------------------------------------------------------------------- memory pressure
    def host_footprint_bytes(self) -> int:
        """Host memory the tier holds for optimizer state now: buffers kept between uses, and streaming slots
        brought into use."""
        return self.budget.used_bytes + self._streaming_slots_bytes()

    def _streaming_slots_bytes(self) -> int:
        """The streaming slots in memory (in use or idle; not the retired)."""
        stats = self.pool.stats()
        return stats["reserved_bytes"] - stats["retired_bytes"]

    def idle_streaming_slots(self) -> int:
        """Streaming slots in memory that nothing uses now (a retired one is not: using it would map memory)."""
        slots = self.pool.class_slots().get(self.streaming_slot_bytes, {})
        return slots.get("slots", 0) - slots.get("in_use", 0) - slots.get("retired", 0)

    def least_host_footprint_bytes(self, reads_ahead: bool, writes_behind: bool = False) -> int:
        """The footprint when the tier keeps nothing: the streaming slots one update can hold at once
        (plan/host_tier.streaming_tensors_at_once), at most the slots there are."""
        tensors = streaming_tensors_at_once(reads_ahead, writes_behind)
        slots = self.pool.class_slots().get(self.streaming_slot_bytes, {}).get("slots", 0)
        return min(tensors, slots) * self.streaming_slot_bytes

    def resize_host_footprint(self, target_bytes: int, state_bytes: int, reads_ahead: bool,
                              update_slots: int = 0, writes_behind: bool = False) -> None:
        """Hold about ``target_bytes`` of host memory for optimizer state from now on (memory pressure, or memory
        back): a budget for kept buffers that leaves room for the streaming slots, since whatever is not kept
        streams through them; all of it but ``update_slots`` streaming slots for kept buffers when that holds the
        whole state (``state_bytes``: nothing streams, the other streaming slots are given back).
        ``update_slots``: slots an update lends even when everything is kept (a gradient filled from DeepSpeed's
        own buffer, which is never kept): planned, not brought back and given up again at every resize."""
        kept_for_updates = update_slots * self.streaming_slot_bytes
        everything = target_bytes >= state_bytes + kept_for_updates
        # Streaming, the slots in memory stay (only keeping everything retires them): beyond the least an update
        # holds (no reads ahead, a slow drive) they are footprint too. Counting only the least, a target below the
        # footprint could leave a larger budget than before (helper-156's review: memory pressure then "gave back"
        # at every reading and never stopped the run before the OOM killer)
        streaming = max(self.least_host_footprint_bytes(reads_ahead, writes_behind), self._streaming_slots_bytes())
        budget = target_bytes - kept_for_updates if everything else max(0, target_bytes - streaming)
        self.budget.resize(budget)
        self.entries.trim_kept(budget)
        if everything:  # a slot still writing out the last update's sub-group is not free: wait for it first
            self.entries.wait_writes()
            slots = self.pool.class_slots().get(self.streaming_slot_bytes, {"slots": 0, "retired": 0})
            self.pool.retire_free(self.streaming_slot_bytes, slots["slots"] - slots["retired"] - update_slots)

    def planned_host_footprint_bytes(self, state_bytes: int, reads_ahead: bool, update_slots: int = 0,
                                     writes_behind: bool = False) -> int:
        """The footprint the budget plans for: the budget, and the streaming slots when it cannot keep everything
        (else the ``update_slots`` an update still lends)."""
        streams = self.budget.total_bytes < state_bytes
        streaming = self.least_host_footprint_bytes(reads_ahead, writes_behind)
        return self.budget.total_bytes + (streaming if streams else update_slots * self.streaming_slot_bytes)

    def state_bytes(self, tensor_numels: Iterable[int]) -> int:
        """The page-rounded buffers keeping every tensor of ``tensor_numels`` (each in this store's elements) takes:
        the swapper lists every sub-group's master, optimizer state and the gradients the tier can hold."""
        return sum(self._kept_bytes(numel) for numel in tensor_numels)

    def _kept_bytes(self, numel: int) -> int:
        # (whole host pages, as BudgetedPageable reserves a kept buffer: helper-239, 64 KiB pages)
        return round_up(self.entries.swap_nbytes(numel), HOST_PAGE_BYTES)

    def close(self) -> None:
        """Give every buffer back (dirty bytes are not written: flush first), then the streaming slots' arena."""
        self.entries.close()
        self.pool.close()
