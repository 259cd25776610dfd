"""Where a store's host buffers come from (cache/buffer_sources.py): what the sources reserve and hold stays
accounted on their error paths."""
import pytest

from tencache_ds.cache.buffer_sources import BudgetedPageable
from tencache_ds.cache.host_budget import HostBudget
from tencache_ds.memory.pool import BufferPool


def test_a_buffer_the_kernel_refuses_to_map_leaves_nothing_reserved_from_the_budget():
    """Scenario: a budget larger than the machine (a host budget from an old machine file), and a buffer the kernel
    refuses to map (2^60 bytes: beyond a process's address space, refused whatever the overcommit policy). The
    reservation taken before the mapping is given back, so the budget's room is not lost for the rest of the run."""
    budget = HostBudget(1 << 62)
    source = BudgetedPageable(BufferPool("optimizer", lock="off"), budget)
    with pytest.raises((OSError, MemoryError)):
        source.try_acquire(1 << 60)
    assert budget.used_bytes == 0 and budget.available() == 1 << 62
    source.check()
    buffer = source.try_acquire(4096)  # the source still hands out and accounts what fits
    assert budget.used_bytes == 4096 and source.keeps(buffer)
    source.release(buffer)
    assert budget.used_bytes == 0
