"""The host tier split between the swappers. Owns: the optimizer swapper's bytes of the host tier, which follow
from the parameter swappers' (their cache slots are planned first, so that the split is the same on every run) and
the other optimizer swappers' alive in the process.
The one place where one swapper reads another's plan: the swappers themselves never reach sideways. Does not own
the split's rule (cache/optimizer_store.py ``optimizer_tier_share``, plan/host_tier.py) nor the budget
(plan/budget.py)."""
import threading
import weakref

from ...cache.optimizer_store import optimizer_tier_share
from ...config import TencacheConfig
from ...plan.budget import MachineResources, resolve_budgets
from . import param_swapper

# the optimizer swappers that took a share of the host tier (weakly: one garbage collected holds none)
_SHARE_TAKERS = weakref.WeakSet()
_SHARE_LOCK = threading.Lock()


def optimizer_host_share(config: TencacheConfig, optimizer, swapper) -> int:
    """The optimizer store's bytes of the host tier: the budget (``config``'s, resolved on this machine) after the
    live parameter swappers' cache slots and the shares of the other optimizer swappers alive in this process, in
    proportion to ``optimizer``'s parameter elements. ``host_cache_bytes`` is the rank's: engines trained at once
    (an actor and a critic) share it, the one made first taking its share first; before 2026-12-07 each took the
    whole tier, so two engines held up to twice the budget (helper-162). Their governors then grow and shrink
    each share into the memory the steps leave (memory_pressure.py)."""
    with _SHARE_LOCK:
        others = sum(_held_at_most(other) for other in list(_SHARE_TAKERS) if other is not swapper)
        _SHARE_TAKERS.add(swapper)
    param_bytes = param_elements = streaming_bytes = 0
    locks_memory = False
    for params in param_swapper.live_swappers():
        params.plan()
        param_bytes += params.store.cache_bytes_reserved
        streaming_bytes += params.store.streaming_bytes_reserved
        locks_memory |= params.lock_mode != "off"
    budgets = resolve_budgets(config, MachineResources.probe(), stream_min_bytes=streaming_bytes,
                              locks_memory=locks_memory)
    for group in getattr(optimizer, "param_groups", []):
        param_elements += sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in group["params"])
    return optimizer_tier_share(max(0, budgets.host_cache_bytes - others), param_bytes, param_elements)


def _held_at_most(swapper) -> int:
    """The host tier another optimizer swapper may hold: its budget, at most its whole state (a store's share is at
    least the whole tier, however small its state: what it can never fill is left to the others); none once closed
    or before its store was made."""
    if getattr(swapper, "closed", False) or getattr(swapper, "budget", None) is None:
        return 0
    return min(swapper.budget.total_bytes, swapper.state_bytes())
