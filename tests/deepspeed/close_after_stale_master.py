"""The parameter swapper's rest and close when an optimizer's master file is stale for good (a settle raises): an
engine's destroy (``release_user``) rests all the same (its slots given back), and close closes all the same (its
I/O threads, files and folder lock let go), each then raising that error, where each used to raise before doing
anything. Runs the real swapper on DeepSpeed's CPU accelerator; prints OK or raises."""
import sys
import threading
from concurrent.futures import Future

import torch

from lone_swapper import Param, lone_swapper
from tencache_ds.integrations.deepspeed.master_write_behind import MasterWriteBehind

swapper, _nvme = lone_swapper(sys.argv[1])
param = Param(7, 1 << 16)  # a partition written: the swapper's I/O threads are running
buffer = swapper.get_buffer(param, 1 << 16)
buffer.fill_(1.0)
param.ds_tensor.data = buffer.data
swapper.swap_out_and_release([param])
threads_before = {thread.name for thread in threading.enumerate()}
assert any("tencache" in name for name in threads_before), threads_before  # its I/O threads
# an optimizer's writer whose master file is stale for good (settle_owed_masters asks it), with a fill done
writer = MasterWriteBehind(lambda group: None, lambda group: (frozenset([1]), 2), lambda group, into: [],
                           lambda *args, **kwargs: None, torch.float32)
writer.stale_for_good(RuntimeError("master file behind for good"))
done = Future()
done.set_result(None)
writer.filling("g", [done])
swapper.add_user()  # an engine uses the swapper, then is destroyed
try:
    swapper.release_user()
    raise AssertionError("release_user did not raise the settle's error")
except RuntimeError as err:
    assert "behind for good" in str(err), err
assert swapper.resting and swapper.store.pool.stats()["reserved_bytes"] == 0, swapper.store.pool.stats()
try:
    swapper.close()
    raise AssertionError("close did not raise the settle's error")
except RuntimeError as err:
    assert "behind for good" in str(err), err
assert swapper.closed
left = {thread.name for thread in threading.enumerate() if "tencache" in thread.name} - {"MainThread"}
assert not left, left
print("OK")
