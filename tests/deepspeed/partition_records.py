"""The parameter swapper's partition records (integrations/deepspeed/partition_record.py) through a scenario on the
real swapper: after every call the records agree with DeepSpeed's view of each partition (the swapper checks them
itself under TENCACHE_DEBUG_CHECKS=1, and the scenario checks them again). The prefetch schedule is a stand-in that
names the reads ahead each step wants. Runs on DeepSpeed's CPU accelerator; prints OK or raises."""
import gc
import shutil
import sys
import types

import torch
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus as Status

from lone_swapper import Param, lone_swapper
from tencache_ds.errors import StaleFileError
from tencache_ds.integrations.deepspeed.partition_record import Read

NUMEL = 1 << 18  # 1 MiB of float32: DeepSpeed swaps nothing smaller

swapper, _nvme = lone_swapper(sys.argv[1], TENCACHE_DEBUG_CHECKS="1")


class Schedule:
    """Stands in for plan/prefetch.PrefetchSchedule: the reads ahead wanted next, and the late ones fed back."""

    def __init__(self):
        self.wanted, self.late_at = [], []

    def to_issue(self, _position):
        wanted, self.wanted = self.wanted, []
        return wanted

    def late(self, position):
        self.late_at.append(position)


def read(key):
    record = swapper._partitions.get(key)
    return None if record is None else record.read


def read_ahead(*params):
    """The schedule wants ``params`` read ahead: the swapper starts them at its next read-ahead point (targets far
    ahead of the step's current access)."""
    for param in params:
        keys[FAR + len(keys)] = param.ds_id
        schedule.wanted.append(FAR + len(keys) - 1)
    swapper._read_ahead_by_schedule()
    swapper.check_records()


def bytes_of(param):
    return torch.full((NUMEL,), float(param.ds_id))


# 1. zero.Init writes three partitions: one record each, no read pending, DeepSpeed sees them NOT_AVAILABLE
a, b, c = Param(1, NUMEL), Param(2, NUMEL), Param(3, NUMEL)
for param in (a, b, c):
    swapper.get_buffer(param, NUMEL).copy_(bytes_of(param))
swapper.swap_out_and_release([a, b, c])
assert [read(p.ds_id) for p in (a, b, c)] == [Read.NONE] * 3
assert all(p.ds_tensor.status == Status.NOT_AVAILABLE for p in (a, b, c))

# 2. the coordinator's prefetch asks for a, then b: both INFLIGHT, held by their records, waited for in that order
swapper.swap_in([a], async_op=True)
swapper.swap_in([b], async_op=True)
assert read(1) is read(2) is Read.ASKED and swapper._partitions[1].asked_order < swapper._partitions[2].asked_order
assert swapper._partitions[1].waiter is a and a.ds_tensor.status == Status.INFLIGHT
swapper.check_records()

# 3. synchronize_reads: both AVAILABLE with their bytes, nothing pending
swapper.synchronize_reads()
assert torch.equal(a.ds_tensor, bytes_of(a)) and torch.equal(b.ds_tensor, bytes_of(b))
assert read(1) is read(2) is Read.NONE and swapper._partitions[1].waiter is None
swapper.remove_partition_and_release_buffers([a, b])

# 4. from here the schedule plans reads ahead (a stand-in profile: access index -> partition)
schedule, keys, FAR = Schedule(), {}, 1 << 20
swapper._current_schedule = lambda: schedule
swapper.profile = types.SimpleNamespace(profile=types.SimpleNamespace(keys=keys), end_step=lambda: None)

# 5. c is read ahead: DeepSpeed is not told (NOT_AVAILABLE), so its synchronize_reads does not wait for it
read_ahead(c)
assert read(3) is Read.AHEAD and c.ds_tensor.status == Status.NOT_AVAILABLE and swapper.scheduled_reads == 1
swapper.synchronize_reads()
assert read(3) is Read.AHEAD

# 6. DeepSpeed asks for c: it waits for the read already started, no second one
swapper.swap_in([c], async_op=True)
assert read(3) is Read.ASKED_AHEAD and c.ds_tensor.status == Status.INFLIGHT
swapper.synchronize_reads()
assert torch.equal(c.ds_tensor, bytes_of(c)) and read(3) is Read.NONE
swapper.remove_partition_and_release_buffers([c])

# 7. a is read ahead and asked for, then rewritten before anyone waits (the step ends first): its record settles,
#    so its next ask is a plain one and no late read is fed back for it (a leftover "read ahead" mark would)
read_ahead(a)
swapper.swap_in([a], async_op=True)
assert read(1) is Read.ASKED_AHEAD
swapper.swap_out_partitioned_params([a], [bytes_of(a) + 1])
assert read(1) is Read.NONE and a.ds_tensor.status == Status.NOT_AVAILABLE
swapper.swap_in([a], async_op=True)
assert read(1) is Read.ASKED
swapper.synchronize_reads()
assert torch.equal(a.ds_tensor, bytes_of(a) + 1) and schedule.late_at == []
swapper.remove_partition_and_release_buffers([a])

# 8. b is read ahead and nobody asks (the sequence diverged): the end of the optimizer step gives the read back
read_ahead(b)
assert read(2) is Read.AHEAD
swapper.end_optimizer_step()
assert read(2) is Read.NONE and b.ds_tensor.status == Status.NOT_AVAILABLE

# 8b. b is read ahead, then released without being asked for (a parameter the device tier kept gathered is
#     partitioned at its release, and DeepSpeed gives the partition back): the record settles with the read, so a
#     later ask reads the partition (a leftover "read ahead" mark started no read, and the wait found none in flight)
read_ahead(b)
assert read(2) is Read.AHEAD
swapper.remove_partition_and_release_buffers([b])
assert read(2) is Read.NONE and b.ds_tensor.status == Status.NOT_AVAILABLE
swapper.swap_in([b], async_op=False)
assert torch.equal(b.ds_tensor, bytes_of(b)) and read(2) is Read.NONE
swapper.remove_partition_and_release_buffers([b])

# 8c. b is read ahead and its file is gone (the read fails), and nobody asks: the end of the optimizer step raises
#     the read's error after giving every read back, with b's record settled (a record left "read ahead" after its
#     release raised made the next ask wait for no read: "no read in flight"); the file back, an ask reads it
path = swapper.get_path(b)
shutil.move(path, path + ".away")
read_ahead(b)
assert read(2) is Read.AHEAD
try:
    swapper.end_optimizer_step()
    raise SystemExit("a read ahead that failed was not reported")
except StaleFileError:
    pass
assert read(2) is Read.NONE and b.ds_tensor.status == Status.NOT_AVAILABLE
swapper.check_records()
shutil.move(path + ".away", path)
swapper.swap_in([b], async_op=False)
assert torch.equal(b.ds_tensor, bytes_of(b)) and read(2) is Read.NONE
swapper.remove_partition_and_release_buffers([b])

# 8d. b is read ahead and its read fails, and nobody asks; the update writes a (another sub-group's partition):
#     its bytes are written and the step goes on, b's dead read said in the log (helper-221: raised, it stopped the
#     update before a was written, its master stepped and its partition not)
path = swapper.get_path(b)
shutil.move(path, path + ".away")
read_ahead(b)
assert read(2) is Read.AHEAD
swapper.swap_out_partitioned_params([a], [bytes_of(a) + 8])
swapper.store.wait_writes()
shutil.move(path + ".away", path)
swapper.end_optimizer_step()
swapper.swap_in([a, b], async_op=False)
assert torch.equal(a.ds_tensor, bytes_of(a) + 8) and read(2) is Read.NONE
swapper.remove_partition_and_release_buffers([a, b])

# 9. a max_in_cpu swap-in of a partition read ahead: the read is given back, the caller gets its own copy
read_ahead(c)
own = torch.empty(NUMEL)
swapper.swap_into_buffer(c, own)
assert torch.equal(own, bytes_of(c)) and read(3) is Read.NONE

# 10. a parameter that no longer exists (its model destroyed while the swapper serves another): its record goes at
#     the end of the next optimizer step, the others stay
d = Param(4, NUMEL)
swapper.get_buffer(d, NUMEL).copy_(bytes_of(d))
swapper.swap_out_and_release([d])
assert read(4) is Read.NONE
del d
gc.collect()
swapper.end_optimizer_step()
assert read(4) is None and [read(p.ds_id) for p in (a, b, c)] == [Read.NONE] * 3

# 10b. the next step's first partitions (the schedule's tail reads: a, then b) are read during the optimizer step,
#      each once its new bytes are written (a read before would give the step the old weights); their records stay
#      "read ahead" past the step's end, and the next step's asks wait for those reads and get the new bytes
swapper._tail_read_keys = (1, 2)
swapper.swap_in([b], async_op=False)  # a read of the step: the optimizer step below ends it
swapper.remove_partition_and_release_buffers([b])
swapper.swap_out_partitioned_params([a], [bytes_of(a) + 2])
assert read(2) is Read.NONE  # not rewritten yet: its read would give the old bytes (a: read once its write is done)
swapper.store.wait_writes()
swapper.swap_out_partitioned_params([b], [bytes_of(b) + 2])  # a's write is done: a is read by now
assert read(1) is Read.AHEAD
swapper.store.wait_writes()
swapper.end_optimizer_step()  # b's write done: b too; a's read is not given back at the step's end
assert read(1) is read(2) is Read.AHEAD and swapper.update_reads == 2
assert a.ds_tensor.status == b.ds_tensor.status == Status.NOT_AVAILABLE
swapper.end_optimizer_step()  # stage 3's _post_step after the last sub-group: still kept
assert read(1) is read(2) is Read.AHEAD
swapper.swap_in([a], async_op=True)
assert read(1) is Read.ASKED_AHEAD and read(2) is Read.AHEAD
swapper.synchronize_reads()
assert torch.equal(a.ds_tensor, bytes_of(a) + 2) and read(1) is Read.NONE
swapper.remove_partition_and_release_buffers([a])
swapper.swap_in([b], async_op=False)
assert torch.equal(b.ds_tensor, bytes_of(b) + 2) and read(2) is Read.NONE
swapper.remove_partition_and_release_buffers([b])

# 10c. a second optimizer step with no forward between (a is read for the next step, then rewritten again): the
#      stale read is given back before the write, and the new bytes are read once written
swapper.swap_out_partitioned_params([a], [bytes_of(a) + 3])
swapper.store.wait_writes()
swapper.end_optimizer_step()
assert read(1) is Read.AHEAD
swapper.swap_out_partitioned_params([a], [bytes_of(a) + 4])
swapper.store.wait_writes()
swapper.end_optimizer_step()
assert read(1) is Read.AHEAD
swapper.swap_in([a], async_op=False)
assert torch.equal(a.ds_tensor, bytes_of(a) + 4) and read(1) is Read.NONE
swapper.remove_partition_and_release_buffers([a])

# 10e. stage 3 gathers its persistent parameters again at the update's end (_post_step, before end_optimizer_step):
#      that swap-in is no read of the next step, so the reads started for it stay (a swap-in of another parameter
#      would have made them ordinary reads ahead, given back at the step's end)
p = Param(5, NUMEL)
p.ds_persist = True
swapper.get_buffer(p, NUMEL).copy_(bytes_of(p))
swapper.swap_out_and_release([p])
started = swapper.update_reads
swapper.swap_out_partitioned_params([a], [bytes_of(a) + 6])
swapper.store.wait_writes()
swapper.swap_out_partitioned_params([b], [bytes_of(b) + 6])
assert read(1) is Read.AHEAD
swapper.swap_in([p], async_op=False)
swapper.store.wait_writes()
swapper.end_optimizer_step()
assert read(1) is read(2) is Read.AHEAD and p.ds_tensor.status == Status.AVAILABLE
assert swapper.update_reads - started == 2  # each read once: a's was not given back and started again
swapper.swap_in([a, b], async_op=False)
assert torch.equal(a.ds_tensor, bytes_of(a) + 6) and torch.equal(b.ds_tensor, bytes_of(b) + 6)
swapper.remove_partition_and_release_buffers([a, b, p])

# 10d. the last engine goes (release_user) with a read for a next step that will not come: given back, slots too
swapper.swap_out_partitioned_params([a], [bytes_of(a) + 7])
swapper.store.wait_writes()
swapper.end_optimizer_step()
assert read(1) is Read.AHEAD
swapper.add_user()
swapper.release_user()
assert read(1) is Read.NONE and swapper.resting and swapper.store.lent_or_reading() == 0
swapper.wake()
swapper._tail_read_keys = ()

# 11. the check catches a record that disagrees with DeepSpeed: "asked for" while DeepSpeed sees NOT_AVAILABLE
swapper._partitions[2].ask(b, ahead=False, order=99)
try:
    swapper.check_records()
    raise SystemExit("check_records missed a partition asked for but NOT_AVAILABLE")
except AssertionError as err:
    assert "partition 2: asked for but" in str(err), err
swapper._partitions[2].settle()
swapper.close()
print("OK")
