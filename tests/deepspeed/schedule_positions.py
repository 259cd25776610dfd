"""Reads ahead by the schedule where one swap-in records a whole gather bucket: stage 3 asks for several partitions
in one call, so the step's access position jumps by the bucket, and the reads the schedule issues at the positions
passed in between are started too. Until 2026-12-07 only the position reached was asked for (helper-162's review:
with buckets of 3, 3 of a profile's 21 planned reads were ever started). Runs the real swapper on DeepSpeed's CPU
accelerator with a stand-in schedule; prints OK or raises."""
import sys
import types

import torch

from lone_swapper import Param, lone_swapper
from tencache_ds.integrations.deepspeed.partition_record import Read

NUMEL = 1 << 16
swapper, _nvme = lone_swapper(sys.argv[1], TENCACHE_DEBUG_CHECKS="1")
a, b, c, d = (Param(index, NUMEL) for index in (1, 2, 3, 4))
for param in (a, b, c, d):
    swapper.get_buffer(param, NUMEL).fill_(float(param.ds_id))
swapper.swap_out_and_release([a, b, c, d])
swapper.swap_in([a], async_op=False)  # (the first swap-in sets up the profile the stand-in replaces): access 0
swapper.remove_partition_and_release_buffers([a])


class Schedule:
    """Stands in for plan/prefetch.PrefetchSchedule: d's read (access 6) is issued at access 2."""

    def __init__(self):
        self.asked = []

    def to_issue(self, position):
        self.asked.append(position)
        return (6,) if position == 2 else ()

    def late(self, position):
        pass


schedule = Schedule()
swapper._current_schedule = lambda: schedule
swapper.profile = types.SimpleNamespace(profile=types.SimpleNamespace(keys={6: d.ds_id}), end_step=lambda: None)
swapper.swap_in([a, b, c], async_op=False)  # one bucket: accesses 1, 2 and 3 recorded at once
assert swapper.store.recorder.position == 4, swapper.store.recorder.position
assert {1, 2, 3, 4} <= set(schedule.asked), schedule.asked
assert swapper._partitions[d.ds_id].read is Read.AHEAD and swapper.scheduled_reads == 1
swapper.remove_partition_and_release_buffers([a, b, c])
swapper.swap_in([d], async_op=False)  # served by the read ahead
assert torch.equal(d.ds_tensor.data, torch.full((NUMEL,), 4.0))
swapper.remove_partition_and_release_buffers([d])
swapper.close()
print("OK")
