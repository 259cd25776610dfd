"""install.close_swappers_of, what an engine's destroy does to tencache's swappers: once per optimizer. A second
destroy of one engine (stock tolerates it) took a second user from a parameter swapper that another engine over the
same zero.Init context still trained with, and put it to rest under that engine."""
import threading
import types

from tencache_ds.integrations.deepspeed.install import close_swappers_of
from tencache_ds.integrations.deepspeed.param_swapper import TencacheParamSwapper


def test_a_second_destroy_of_one_engine_takes_no_second_user():
    swapper = object.__new__(TencacheParamSwapper)  # the state release_user reads, without a folder or files
    swapper._lock, swapper._users, swapper.resting, swapper.replaced, swapper.closed = \
        threading.RLock(), 2, False, False, False
    parameter = types.SimpleNamespace(nvme_swapper=swapper)
    first = types.SimpleNamespace(fp16_groups=[[parameter]])  # two engines' optimizers over one swapper
    close_swappers_of(first)
    assert swapper._users == 1 and not swapper.resting
    close_swappers_of(first)  # destroyed again: the other engine still trains
    assert swapper._users == 1 and not swapper.resting
