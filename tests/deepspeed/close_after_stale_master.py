"""The parameter swapper's close when an optimizer's master file is stale for good (a settle raises): it closes all
the same (its I/O threads, files and folder lock let go) and then raises that error, where it used to raise before
closing anything. Runs the real swapper on DeepSpeed's CPU accelerator; prints OK or raises."""
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
# an optimizer's writer whose master file is stale for good, with a fill in flight (settle_owed_masters asks it)
writer = MasterWriteBehind(lambda group: None, lambda group: (frozenset([1]), 2), lambda group, into: [],
                           lambda *args, **kwargs: None, torch.float32)
writer.stale_for_good(RuntimeError("master file behind for good"))
done = Future()
done.set_result(None)
writer.filling("g", [done])
try:
    swapper.close()
    raise AssertionError("close did not raise the settle's error")
except RuntimeError as err:
    assert "behind for good" in str(err), err
assert swapper.closed
left = {thread.name for thread in threading.enumerate() if "tencache" in thread.name} - {"MainThread"}
assert not left, left
print("OK")
