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


def test_under_python_dash_o_a_released_pageable_buffer_is_freed_and_a_second_release_refused():
    """``python -O`` (PYTHONOPTIMIZE, set by some launch scripts) drops asserts with their expressions: the pool's
    release did its bookkeeping inside one, so under -O every pageable buffer (optimizer state, transient mappings,
    zero.Init staging) stayed mapped after its release, and host memory grew until the kernel killed the run."""
    import os
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = ("import gc, weakref\n"
              "from tencache_ds.memory.pool import BufferPool\n"
              "pool = BufferPool('optimizer', lock='off')\n"
              "buffer = pool.acquire_pageable(1 << 20)\n"
              "base = weakref.ref(buffer._base)\n"
              "pool.release(buffer)\n"
              "try:\n"
              "    pool.release(buffer)\n"
              "    print('second release accepted')\n"
              "except ValueError:\n"
              "    pass\n"
              "del buffer\n"
              "gc.collect()\n"
              "print('freed' if base() is None else 'still mapped')\n")
    done = subprocess.run([sys.executable, "-O", "-c", script], cwd=repo, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=repo), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["freed"], done.stdout


def test_a_host_budget_released_twice_is_refused_not_driven_negative():
    """The check was an assert: under ``python -O`` a second release drove the reserved bytes below 0, and the
    budget then admitted more than its total. A RuntimeError (not an AssertionError) is what -O keeps."""
    from tencache_ds.cache.host_budget import HostBudget
    budget = HostBudget(100)
    assert budget.try_reserve(60)
    budget.release(60)
    with pytest.raises(RuntimeError, match="60 bytes released, but only 0 are reserved"):
        budget.release(60)
    assert budget.used_bytes == 0 and budget.try_reserve(100) and not budget.try_reserve(1)
