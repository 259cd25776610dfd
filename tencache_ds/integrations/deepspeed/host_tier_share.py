"""The host tier split between the two swappers. Owns: the optimizer swapper's bytes of the host tier, which follow
from the parameter swappers' (their cache slots are planned first, so that the split is the same on every run).
The one place where one swapper reads another's plan: the swappers themselves never reach sideways. Does not own
the split's rule (cache/optimizer_store.py ``optimizer_tier_share``, plan/host_tier.py) nor the budget
(plan/budget.py)."""
from ...cache.optimizer_store import optimizer_tier_share
from ...config import TencacheConfig
from ...plan.budget import MachineResources, resolve_budgets
from . import param_swapper


def optimizer_host_share(config: TencacheConfig, optimizer) -> int:
    """The optimizer store's bytes of the host tier: the budget (``config``'s, resolved on this machine) after the
    live parameter swappers' cache slots, in proportion to ``optimizer``'s parameter elements."""
    param_bytes = param_elements = streaming_bytes = 0
    locks_memory = False
    for swapper in param_swapper.live_swappers():
        swapper.plan()
        param_bytes += swapper.store.cache_bytes_reserved
        streaming_bytes += swapper.store.streaming_bytes_reserved
        locks_memory |= swapper.lock_mode != "off"
    budgets = resolve_budgets(config, MachineResources.probe(), stream_min_bytes=streaming_bytes,
                              locks_memory=locks_memory)
    for group in getattr(optimizer, "param_groups", []):
        param_elements += sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in group["params"])
    return optimizer_tier_share(budgets.host_cache_bytes, param_bytes, param_elements)
