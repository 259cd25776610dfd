"""The fp32 masters' second copy: the parameter partitions. Owns: whether a swapped sub-group's fp32 master can be
filled from its parameter partitions instead of read from its file, and that fill (and the partitions' views, which
a write behind and a checkpoint's ZeRO file write the master from).

Why it can: after each sub-group's update stage 3 copies the new master into the sub-group's parameter partitions
(``_partitioned_params_swap_out``: partition by partition, in ``fp16_groups`` order, ``ds_numel`` elements each),
and those partitions are what the master is made of at initialisation. Where the partitions are in the masters'
dtype (a model trained in fp32), that copy is exact, so until a partition is written otherwise, the concatenated
partitions are the master, bit for bit. A tier that holds the partitions in host memory for the next forward pass
(the parameter swapper's cache) then saves the master's read, a third of the update's reads with Adam.

When it is current (cache/copy_validity.py holds the rule): stage 3 copied the master into the partitions while the
sub-group was lent (install.py wraps ``_partitioned_params_swap_out``), and no partition has been written since:
the parameter swapper counts its writes (``partition_writes``: zero.Init, a gather that modified its parameter,
stage 3's copy); a partition outside tencache's swapper (too small to swap: it stays in host memory) is compared by
its tensor's version counter and storage, which a modifying gather's in-place copy moves (a write through its
``.data`` would not: DeepSpeed writes resident partitions so only in stage 3's own copy of the master, and for frozen
parameters, which have none). A checkpoint load, files adopted under other ids, a purge or a new initialisation
forgets every copy, and a copy stage 3 makes while the sub-group is not lent forgets its own
(masters_in_partitions.py).
A partition of another dtype (bf16 or fp16 training), or a sub-group whose parameters stage 3 keeps in its own flat
buffer, is never a copy.

The fill copies each partition from host memory of the parameter swapper's (held, lent, or being written) or from
the resident tensor, and reads one that is only on file from that file (exactly its bytes, at its offset in the
master: ``read_partition_into``); the caller waits for those reads. An evicted partition's file holds its bytes
unchanged, so a master whose own file is behind its partitions (owed: master_write_behind.py) is filled so wherever
they are; the reads are reported to the writer (``filling``), and a change to one of those partitions waits for
them. A resident partition that is not available is a broken rule where the master is owed, raised
(masters_in_partitions.py); otherwise the master's own file, current then, is read instead.
"""
import concurrent.futures
import weakref
from concurrent.futures import Future
from typing import List, Optional, Tuple

import torch
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus

from ...cache.copy_validity import CopyValidity
from .param_swapper import TencacheParamSwapper


class MasterCopies:
    """For one ZeRO-3 optimizer (``stage3``) whose swapped masters are ``dtype``: which sub-groups' masters its
    parameter partitions hold, and the fill. Sub-groups are named by their master's ``ds_id`` (the optimizer
    swapper's group ids)."""

    def __init__(self, stage3, dtype: torch.dtype):
        self._stage3 = weakref.ref(stage3)
        self.dtype = dtype
        self.validity = CopyValidity()
        self._index = None  # group id -> sub-group index, built at first use (the masters exist by then)
        self.bytes_read_from_partition_files = 0  # SUM: master bytes an update's fill read from partitions' files

    # ------------------------------------------------------------------------- the optimizer swapper's calls
    def lent(self, group) -> None:
        self.validity.lent(group)

    def copied_to_partitions(self, sub_group_index: int, group) -> None:
        """Stage 3 copied sub-group ``sub_group_index``'s master (lent as ``group``) into its partitions."""
        versions = self._versions(sub_group_index)
        if versions is not None:
            self.validity.copied_out(group, versions)

    def released(self, group, changed: bool) -> None:
        self.validity.released(group, changed)

    def forget(self, group) -> None:
        self.validity.forget(group)

    def forget_all(self) -> None:
        self.validity.forget_all()

    def current(self, group, anywhere: bool = False) -> bool:
        """Do the partitions hold ``group``'s master now, each in host memory the parameter swapper keeps? (Kept, not
        merely lent: a partition streamed through a slot is gone by the update, and the master's read is then better
        started ahead than found missing at the fill.) ``anywhere``: in host memory or on the partitions' own files
        (a fill reads those: the master's file need not be written for them, master_write_behind.py)."""
        index = self._sub_group_index(group)
        if index is None:
            return False
        versions = self._versions(index)
        return versions is not None and self.validity.current(group, versions) and (anywhere or self._kept(index))

    def fill(self, group, into: torch.Tensor, counted: bool = True) -> Optional[List[Future]]:
        """Fill ``into`` (the master's numel) with ``group``'s partitions: copied from host memory, and read from
        their files where they are there only (those reads are returned, for the caller to wait for; none where
        every partition was in host memory). None, with ``into`` partly written and no read of it in flight, where a
        partition stage 3 keeps resident is not available. ``counted``: the bytes read are an update's (the store's
        fill, ``bytes_read_from_partition_files``), not a settle's, which the store's copied bytes do not count
        either (bench/report_bound.py takes one from the other)."""
        stage3, index = self._stage3(), self._sub_group_index(group)
        if stage3 is None or index is None:
            return None
        offset, reads = 0, []
        try:
            for param, partition, swapper in self._partitions(index):
                dest = into.narrow(0, offset, partition.ds_numel)
                if swapper is not None:
                    read = swapper.read_partition_into(param, dest)
                    if read is not None:
                        reads.append(read)
                        self.bytes_read_from_partition_files += dest.numel() * dest.element_size() if counted else 0
                elif partition.status == PartitionedParamStatus.AVAILABLE:
                    dest.copy_(partition.data)
                else:
                    concurrent.futures.wait(reads)  # nothing may land in ``into`` once the caller has it back
                    return None
                offset += partition.ds_numel
        except BaseException:
            concurrent.futures.wait(reads)
            raise
        if offset != into.numel():
            concurrent.futures.wait(reads)
            raise RuntimeError(f"the partitions of optimizer sub-group {group} hold {offset} elements, its fp32 "
                               f"master {into.numel()}")
        return reads  # (counted by the store that lent the buffer: its copied and copied_bytes)

    def partition_ids(self, group) -> Optional[Tuple[frozenset, int]]:
        """(ds_ids of ``group``'s partitions, the master's numel), or None where it has none of this optimizer's."""
        stage3, index = self._stage3(), self._sub_group_index(group)
        if stage3 is None or index is None:
            return None
        found = [(param.ds_id, partition.ds_numel) for param, partition, _ in self._partitions(index)]
        return frozenset(ds_id for ds_id, _ in found), sum(numel for _, numel in found)

    def partition_views(self, group) -> Optional[Tuple[list, list]]:
        """(ds_ids, views) of ``group``'s partitions: the views of the host memory holding them now, in the master's
        order (``ds_numel`` elements each), together the master's bytes where ``current`` says so. None where one
        is on file only (or no partition of this optimizer's). master_write_behind.py writes the master's file from
        them."""
        stage3, index = self._stage3(), self._sub_group_index(group)
        if stage3 is None or index is None:
            return None
        ids, views = [], []
        for param, partition, swapper in self._partitions(index):
            if swapper is not None:
                view = swapper.partition_view(param)
            elif partition.status == PartitionedParamStatus.AVAILABLE:
                view = partition.data.view(-1)
            else:
                view = None
            # host memory only: partitions on a device (offload_param none) are filled from, never written from
            if view is None or view.device.type != "cpu" or view.dtype != self.dtype or \
                    view.numel() < partition.ds_numel:
                return None
            ids.append(param.ds_id)
            views.append(view.narrow(0, 0, partition.ds_numel))
        return ids, views

    # ------------------------------------------------------------------------------------------- private
    def _sub_group_index(self, group) -> Optional[int]:
        stage3 = self._stage3()
        if stage3 is None:
            return None
        if self._index is None:
            self._index = {getattr(master, "ds_id", None): index
                           for index, master in enumerate(stage3.fp32_partitioned_groups_flat)}
        return self._index.get(group)

    def _partitions(self, index: int):
        """Sub-group ``index``'s (parameter, partition, swapper) in the master's order: ``swapper`` the tencache
        parameter swapper whose store has the partition, None where stage 3 keeps it (resident, or another
        swapper's)."""
        stage3 = self._stage3()
        for param, partition in zip(stage3.fp16_groups[index], stage3.fp16_partitioned_groups[index]):
            swapper = getattr(param, "nvme_swapper", None)
            known = isinstance(swapper, TencacheParamSwapper) and swapper.store.knows(param.ds_id)
            yield param, partition, swapper if known else None

    def _kept(self, index: int) -> bool:
        return all(swapper is None or swapper.store.kept(param.ds_id)
                   for param, _partition, swapper in self._partitions(index))

    def _versions(self, index: int) -> Optional[Tuple]:
        """What says whether sub-group ``index``'s partitions were written: per partition, the parameter swapper's
        count of its writes, or the resident tensor's version counter and storage; None where the partitions cannot
        hold the master (another dtype, or kept in stage 3's own flat buffer)."""
        stage3 = self._stage3()
        if stage3 is None or stage3.fp16_partitioned_groups_flat[index] is not None:
            return None
        versions = []
        for param, partition, swapper in self._partitions(index):
            if swapper is not None:
                # the swapper's dtype: a partition away on file holds a placeholder of another (its .data)
                if swapper.dtype != self.dtype:
                    return None
                versions.append(("swapped", swapper.partition_writes[param.ds_id]))
            elif partition.dtype != self.dtype:
                return None
            else:
                versions.append(("resident", partition._version, partition.data_ptr()))
        return tuple(versions)
