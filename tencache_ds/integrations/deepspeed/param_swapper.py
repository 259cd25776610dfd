"""DeepSpeed's parameter swapper, backed by tencache's TensorStore. Owns: translating the calls ZeRO-3 makes on
``param.nvme_swapper`` (deepspeed-integration.md, a.3) into TensorStore calls, and keeping DeepSpeed's view of
each partition (``ds_tensor.data`` and ``ds_tensor.status``) consistent. Logic lives in cache/tensor_store.py.

Differences from stock that users see: no `Not enough buffers` assertion (a shortage evicts, waits for one write,
then falls back to pageable memory); slots sized per partition size instead of `buffer_count x buffer_size`; with a
host cache, a cached partition is lent without a copy and the new weights after each optimizer step stay in host
memory until evicted (write-back: DeepSpeed never reads the partition files except through this swapper); one
swapper per (nvme_path, dtype, rank), so two engines sharing an nvme_path do not delete each other's files; a
swap-in of a partition that is already resident or in flight (the coordinator's prefetch at several ranks) is not
an error.
"""
import collections
import contextlib
import os
import shutil
import threading
import weakref
from concurrent.futures import Future
from typing import Optional

import torch
from deepspeed import comm as dist
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import (AsyncPartitionedParameterSwapper,
                                                                     PartitionedParamStatus)

from ...cache.entry import EntryState
from ...cache.entry_store import DEBUG_CHECKS_ENV
from ...cache.host_budget import HostBudget
from ...cache.tensor_store import TensorStore
from ...io.direct_io import DirectFileIO, store_io_threads
from ...io import folder_lock
from ...plan.budget import MachineResources, parameter_lock_mode, resolve_budgets
from ...plan.prefetch import PrefetchSchedule
from ...profile.lifecycle import Phase, ProfileLifecycle
from ...errors import TencacheConfigError
from ...ext_lock import raise_if_stale_locks
from ...log import logger
from .config_bridge import (DEEPSPEED_OPS, MIN_SWAPPABLE_BYTES, accelerator_is_host, io_aligned_numel,
                            prepare_swap_folder, swap_folder_held, validate_ds_config)
from .agreement import built_on_every_rank
from .config_source import tencache_config
from .master_write_behind import settle_owed_masters
from .node_ranks import count_ranks_on_node
from .partition_record import Read, asked_in_order, check_records, record_of
from .profiling import param_sequence_facts, profile_section, rank_profile_path

NVME_PATH_KEY = "zero_optimization.offload_param.nvme_path"


class TencacheParamSwapper(AsyncPartitionedParameterSwapper):
    """Drop-in for AsyncPartitionedParameterSwapper (subclass, so DeepSpeed's isinstance checks hold).

    Construction returns the stock class when the config has no enabled "tencache" block, and returns the
    existing instance for a (swap folder) it already serves, unless that one is resting (``release_user``): a new
    zero.Init model then gets a swapper of its own, which empties the folder as stock's does.
    """

    _instances = weakref.WeakValueDictionary()  # swap folder -> live swapper
    _instances_lock = threading.Lock()

    def __new__(cls, ds_config, model_dtype):
        count_ranks_on_node()  # (a collective: zero.Init builds the swapper on every rank, its device set)
        return built_on_every_rank(lambda: cls._new(ds_config, model_dtype), "parameter swapper")

    def __init__(self, ds_config, model_dtype):  # pylint: disable=super-init-not-called
        built_on_every_rank(lambda: self._build(ds_config, model_dtype), "parameter swapper")

    @classmethod
    def _new(cls, ds_config, model_dtype):
        config = validate_ds_config(ds_config)  # before any folder is emptied or written
        folder = _swap_folder(ds_config, model_dtype)
        if not config.enabled:
            # stock's swapper empties the folder first: not one a live tencache swapper keeps files in (a second
            # zero.Init model built without the block deleted them, and its engine failed later on a missing
            # file: helper-207); a resting one's files go with it, as under a new tencache swapper
            with cls._instances_lock:
                swapper = cls._instances.get(folder)
                if swapper is not None and not getattr(swapper, "resting", False):
                    raise TencacheConfigError(
                        f"a zero.Init model without an enabled \"tencache\" block uses {folder} "
                        f"(zero_optimization.offload_param.nvme_path), where a live tencache swapper keeps its "
                        f"files, which DeepSpeed's own swapper would delete: give it its own nvme_path, or the "
                        f"same \"tencache\" block")
                if swapper is not None:
                    swapper.replaced = True
            return AsyncPartitionedParameterSwapper(ds_config, model_dtype)
        with cls._instances_lock:
            swapper = cls._instances.get(folder)
            if swapper is None or getattr(swapper, "resting", False):
                # registered once constructed (a constructor that raised leaves the folder to the one before, or to
                # nobody: live_swappers never lists a swapper without a store); a resting one it replaces is marked
                # so once the folder is emptied, not before (the folder held by another run raises first)
                swapper = super().__new__(cls)
                swapper._constructed = False
            return swapper

    def _build(self, ds_config, model_dtype):
        # Stock __init__ is not called on purpose: it locks buffer_count x buffer_size of memory up front.
        if self._constructed:
            # another zero.Init model in the same swap folder shares this swapper, so it must ask for the same
            config = tencache_config(ds_config)
            if config != self.config:
                changed = sorted(key for key in type(config).model_fields
                                 if getattr(config, key) != getattr(self.config, key))
                raise TencacheConfigError(
                    f"a second zero.Init model uses {self.swap_folder} (offload_param.nvme_path) with a different "
                    f'"tencache" block ({", ".join(f"tencache.{key}" for key in changed)}) while the first one is '
                    f"alive; give it its own nvme_path, the same block, or destroy the first engine first")
            return
        self.config = tencache_config(ds_config)  # validated in __new__
        raise_if_stale_locks(ops=DEEPSPEED_OPS)
        self.dtype = model_dtype
        self.swap_config = ds_config.zero_config.offload_param
        self.aio_config = ds_config.aio_config
        self.use_gds = False  # validate_ds_config rejects aio.use_gds
        self.swap_folder = _swap_folder(ds_config, model_dtype)
        self.swap_element_size = torch.empty((), dtype=model_dtype).element_size()
        intra_op = int(self.aio_config.get("intra_op_parallelism", 1))
        self.min_aio_bytes = max(MIN_SWAPPABLE_BYTES, int(self.aio_config.get("block_size", 0)))
        self.numel_alignment = io_aligned_numel(1, model_dtype, intra_op)
        self.elements_per_buffer = self.swap_config.buffer_size
        self.param_buffer_count = self.swap_config.buffer_count
        # the placeholder a partition on file holds (DeepSpeed's is fp16): in the partitions' own dtype, because
        # stage 3 casts a gathered parameter to its partition's dtype, and at 2 ranks it releases a persistent
        # partition on NVMe while its coalesced gather is still in flight (the forward stopped: "Float and Half")
        self.invalid_buffer = torch.tensor(1, dtype=model_dtype)
        self.largest_partition_numels = []   # the largest sub-group's partitions (reserve_partitioned_swap_space)

        # Our own folder, emptied once per process like stock does, so no stale file is ever read; not under another
        # run that uses it now.
        with swap_folder_held(self.swap_folder, self.swap_config.nvme_path, NVME_PATH_KEY) as self._folder_key:
            shutil.rmtree(self.swap_folder, ignore_errors=True)
            with TencacheParamSwapper._instances_lock:
                resting = TencacheParamSwapper._instances.get(self.swap_folder)
                if resting is not None:  # its files went with the folder
                    resting.replaced = True
            prepare_swap_folder(self.swap_folder, self.swap_config.nvme_path, NVME_PATH_KEY)
            # No streaming slot is planned yet (zero.Init registers the partitions next); TensorStore.plan fits the
            # cache slots to the memlock limit after the streaming slots once their sizes are known.
            self.lock_mode = parameter_lock_mode(self.config.pin_memory, accelerator_is_host())
            self.budgets = resolve_budgets(self.config, MachineResources.probe(), stream_min_bytes=0,
                                           locks_memory=self.lock_mode != "off")
            self.io = DirectFileIO(num_threads=store_io_threads(intra_op), name="tencache-param-io")
            self.store = TensorStore(self.swap_folder, model_dtype,
                                     aligned_numel=lambda numel: io_aligned_numel(numel, model_dtype, intra_op),
                                     slots_per_class=max(1, int(self.param_buffer_count)), lock=self.lock_mode,
                                     io=self.io, cache_budget=HostBudget(self.budgets.host_cache_bytes))
            # Step boundaries: the fp16 write-back after each optimizer step. The first segment is initialisation
            # (stage 3 reads every partition to build the fp32 masters), the second is the first training step.
            profile_file = rank_profile_path(self.config.profile_path)
            self.profile = ProfileLifecycle(self.store.recorder, profile_file,
                                            profile_section("params", profile_file, self), first_training_step=1)
            self._sequence_facts = param_sequence_facts(ds_config)
            self._reads_since_write_back = False
            self._profile_looked_up = False
            self._handed_over = False  # stage 3 took partitions (swap_into_buffer) since the slots were last planned
            self._lock = threading.RLock()
            # ds_id -> what the swapper knows of the partition beyond the store: its parameter and where it is in a
            # read of ours (partition_record.py). Reads ahead planned from the profile (plan/prefetch.py) are started
            # in the store without telling DeepSpeed (no INFLIGHT status, so its wait-for-all synchronize_reads never
            # waits for a read needed much later); DeepSpeed's swap-in of the partition then waits for that read only.
            self._partitions = {}
            self._asks = 0  # COUNT: swap-ins that marked a partition INFLIGHT (the order synchronize_reads waits in)
            # COUNT per ds_id: writes of new bytes into a partition through this swapper (zero.Init's, a modifying
            # gather's, stage 3's copy of the updated master): the versions master_copies.py compares
            self.partition_writes = collections.Counter()
            self._debug_checks = os.environ.get(DEBUG_CHECKS_ENV) == "1"  # check the records after every call
            self._schedule = None
            self._schedule_generation = -1
            self.scheduled_reads = 0  # COUNT: reads started ahead by the schedule
            # The next step's first reads, which the schedule cannot start in time within that step (its tail_reads),
            # are started during the optimizer step instead, each once its partition's new bytes are written:
            self._tail_read_keys = ()  # those partitions, soonest needed first
            self._reads_not_started = []  # schedule positions due whose read ahead found no buffer yet
            self._issued_through = -1  # the last position of the step whose reads ahead were issued
            self._rewritten = set()  # partitions given their new bytes since the optimizer step began
            self._read_for_next_step = set()  # read ahead during the optimizer step: kept past its end
            self._update_open = False  # an optimizer step has written back and not ended, nor has a step begun
            self.update_reads = 0  # COUNT: reads started during an optimizer step for the step after it
            self.closed = False
            # engines whose ZeRO-3 optimizer uses this swapper (add_user): the last one destroyed puts it to rest.
            # Not the zero.Init contexts that built it: two models built in one context, each with an engine,
            # counted once, and destroying one engine closed the swapper the other still trained with
            self._users = 0
            # no engine uses it any more, its model still may (release_user; read unlocked by __new__: a bool)
            self.resting = False
            self.replaced = False  # a new zero.Init model took its folder while it rested: its files are gone
            # Its I/O threads and the folder let go when it is garbage collected (its model gone), if not before
            # (close). Not at the process's end: the kernel takes both back then, and the model may still hold
            # partitions (lent) that a close would refuse to forget.
            self._finalizer = weakref.finalize(self, _let_go, self.io, self._folder_key, False)
            self._finalizer.atexit = False
            self._one_rank = None  # world size 1? (asked at the first prefetch: the process group is up by then)
            self._constructed = True  # last: a constructor that raised is run again in full next time
            with TencacheParamSwapper._instances_lock:
                TencacheParamSwapper._instances[self.swap_folder] = self

    # ------------------------------------------------------------------------------ queries DeepSpeed makes
    def swappable_tensor(self, param=None, numel=None):
        if param is not None:
            numel = param.ds_tensor.ds_numel
        if numel is None:
            raise ValueError("swappable_tensor needs a param or a numel")
        return self.min_aio_bytes <= numel * self.swap_element_size

    def get_path(self, param, must_exist=False):
        if must_exist:
            # A reader outside the swapper (offload_optimizer.fast_init) opens the file itself.
            self.store.flush_key(param.ds_id)
        return self.store.path_of(param.ds_id)

    def available_swap_in_buffers(self):
        # The coordinator issues at most this many NVMe prefetches per call, so this sets the prefetch depth.
        # Stock's answer: buffer_count minus the partitions resident or in flight. Every class has
        # min(count, buffer_count) slots, so prefetches within this bound always find a slot of their size.
        # (Summing free slots over classes would let the prefetcher run ahead into a class that has none.)
        # While the host tier holds every partition the profiled step uses, a swap-in lends a held buffer and takes
        # no slot: the held partitions are added (EntryStore.lendable_without_buffer), and the depth is bounded by
        # the coordinator's own rule (twice the elements being gathered). Its gathers then come in buckets, as stock
        # CPU offload's do: on the H200, gpt2-small's step made 47 gathers against stock CPU offload's 3, each with
        # its swap-in and wait, and now swaps in 3 times a step (docs/gpu_check.md, "The fifth lease").
        # Ranks must answer alike: the answer decides which parameters each all-gather takes. Ranks whose host tiers
        # differ (budgets, readings) hold different partitions and read different ones ahead, and told different
        # depths they gathered different buckets: gloo aborted ("Received data size doesn't match expected size").
        # So with several ranks our own reads ahead (each rank's schedule follows its own tier) are not counted as
        # buffers in use, which leaves what DeepSpeed asked for, the same on every rank, and held partitions are
        # added on one rank only.
        self.plan()
        with self._lock:
            if self._one_rank is None:
                self._one_rank = dist.get_world_size() == 1
            in_use = self.store.lent_or_reading()
            if not self._one_rank and (self.scheduled_reads or self.update_reads):  # none ever started: no scan
                in_use -= sum(1 for record in self._partitions.values() if record.read is Read.AHEAD)
            free = max(0, int(self.param_buffer_count) - in_use)
            return free + self.store.lendable_without_buffer() if self._one_rank else free

    # -------------------------------------------------------------------------------- creation (zero.Init)
    def get_buffer(self, param, numel):
        settle_owed_masters([param.ds_id])  # the partition is about to be written (master_write_behind.py)
        self.partition_writes[param.ds_id] += 1
        return self.store.staging_view(param.ds_id, numel)

    def swap_out_and_release(self, params, async_op=False, force_buffer_release=False):
        # Always synchronous: this is zero.Init's one-time write of each new partition (and zenflow's release), or
        # a partition changed by a gather that modified its parameter (GatheredParameters with a modifier rank).
        settle_owed_masters([param.ds_id for param in params])
        with self._lock:
            self.store.write_and_release([param.ds_id for param in params])  # a read ahead of one is finished there
            for param in params:
                self.partition_writes[param.ds_id] += 1
                record = record_of(self._partitions, param)
                if record.read is Read.AHEAD:  # its bytes were replaced: no read of ours is pending any more
                    record.settle()
                    self._read_for_next_step.discard(param.ds_id)
                self._mark_on_file(param)
            self._checked()

    # ------------------------------------------------------------------------------------------ swap in
    def swap_in(self, params, async_op=True, swap_in_buffers=None):
        with self._lock:
            self.plan()
            self._step_reads_begin(params)
            for index, param in enumerate(params):
                record = record_of(self._partitions, param)
                if param.ds_tensor.status != PartitionedParamStatus.NOT_AVAILABLE:
                    # Resident or already being read: with several ranks the coordinator's NVMe prefetch asks again
                    # for partitions it already asked for (stock asserts here). The bytes are, or will be, there.
                    continue
                if async_op and _is_gathered(param):
                    # Gathered, and kept so by the device tier, which gave its partition's slot back: the
                    # coordinator's NVMe prefetch would only lend it again (its gather needs no partition).
                    continue
                into = None if swap_in_buffers is None else swap_in_buffers[index]
                read_ahead = record.read is Read.AHEAD
                record.settle()
                self._read_for_next_step.discard(param.ds_id)
                if read_ahead and into is not None:  # the caller wants the bytes in its own buffer
                    self.store.release(param.ds_id)
                    self.store.start_read(param.ds_id, into=into)
                elif not read_ahead:
                    # async: the coordinator's NVMe prefetch; a synchronous swap-in is a use now
                    self.store.start_read(param.ds_id, into=into, prefetch=async_op)
                param.ds_tensor.status = PartitionedParamStatus.INFLIGHT
                self._asks += 1
                # read ahead and not into a buffer of the caller's: wait for our read at synchronize_reads
                record.ask(param, ahead=read_ahead and into is None, order=self._asks)
            if not async_op:
                self.synchronize_reads()
            else:
                self._read_ahead_by_schedule()

    def synchronize_reads(self):
        # Postcondition (stock): every INFLIGHT param is AVAILABLE.
        with self._lock:
            for key, record in asked_in_order(self._partitions):
                param = record.waiter
                late = record.read is Read.ASKED_AHEAD and not self.store.read_done(key)
                record.settle()
                try:
                    data = self.store.wait_read(key)
                except BaseException:
                    # The store left the partition on file (no partial bytes); DeepSpeed sees it NOT_AVAILABLE, so
                    # a retry reads it again instead of finding "no read in flight". The rest stay INFLIGHT. A wait
                    # interrupted by Ctrl-C gives the lend back itself (the store's wait_read), but not one
                    # interrupted before it waits (taking the store's lock): given back here, or every later swap-in
                    # of it stopped on "already lent or being read".
                    with contextlib.suppress(Exception):  # (a failed read's error is the one raised)
                        self.store.release(key)
                    self._mark_on_file(param)
                    raise
                param.ds_tensor.data = data.data
                param.ds_tensor.status = PartitionedParamStatus.AVAILABLE
                # (only on the profile's track: a step that left it, an evaluation's, has other positions, and its
                # late reads lengthened the leads of unrelated ones: helper-199)
                if late and self._schedule is not None and self.profile.phase is Phase.PREDICTING and \
                        self.store.recorder.on_track:
                    self._schedule.late(self.store.recorder.position - 1)  # its use was just recorded
            self._read_ahead_by_schedule()
            self._checked()

    def swap_into_buffer(self, param, dest_buffer):
        if param.ds_tensor.status != PartitionedParamStatus.NOT_AVAILABLE:  # (stock's assert; python -O strips those)
            raise RuntimeError(f"param {param.ds_id} is already available or inflight")
        settle_owed_masters([param.ds_id])  # handed to stage 3's buffer, which may change it
        with self._lock:
            self._plan_slots()  # (not plan(): the slots are given back once, after the hand-overs: below)
            self._step_reads_begin([param])
            record = self._partitions.get(param.ds_id)
            if record is not None and record.read is Read.AHEAD:  # read into our buffer; the caller wants its own
                record.settle()
                self._read_for_next_step.discard(param.ds_id)
                self.store.release(param.ds_id)
            self.store.read_into(param.ds_id, dest_buffer.narrow(0, 0, _numel(param)))
            self.partition_writes[param.ds_id] += 1  # stage 3's buffer holds it from now on, not ours
            self._mark_on_file(param)
            self.store.hand_over(param.ds_id)  # stage 3 keeps it in its max_in_cpu buffer: no copy of ours stays
            self._handed_over = True
            self._checked()

    def remove_partition_and_release_buffers(self, params, copies_on=None):
        """Release ``params``' partitions, except those a gather in flight reads in place (``_persisted_gather_in_
        flight``: on a host accelerator the collective's input, and at one rank the gathered tensor, is the partition
        itself): stage 3 releases persistent parameters' partitions on NVMe right after their gather starts, and
        they stay gathered, so their slot must stay lent, as stock CPU offload keeps the partition. Released, the slot took another partition's bytes at its next read, which the
        persistent parameter then computed with: after a skipped update, after empty_partition_cache, and in every
        forward pass of an engine without an optimizer (helper-183's review; stock NVMe does the same). Such a
        partition is released when stage 3 partitions the parameter (_partition_param frees its data first).
        ``copies_on``: a stream whose device copies from the partitions may not be waited for yet (ours, not
        DeepSpeed's: coordinator._give_back_partition)."""
        fence = _device_copy_fence(params, copies_on)
        with self._lock:
            for param in params:
                if _persisted_gather_in_flight(param):
                    continue
                record = self._partitions.get(param.ds_id)
                if record is not None and record.read is Read.AHEAD:
                    # read ahead, never asked for (a parameter the device tier kept gathered, partitioned at its
                    # release): the release below gives that read back, so the record must not promise it, or the
                    # next ask waits for a read that is not there ("has no read in flight")
                    record.settle()
                    self._read_for_next_step.discard(param.ds_id)
                self._settle_asked(param)
                self.store.release(param.ds_id, fence=fence)
                self._mark_on_file(param)
            self._checked()

    # ---------------------------------------------------------------------- write-back after optimizer step
    def reserve_partitioned_swap_space(self, partition_num_elems):
        # Stock locks a staging copy of the largest sub-group here; we stage each partition through a slot of
        # its own size class instead, so only the sizes are kept (for stats' stock estimate).
        self.largest_partition_numels = list(partition_num_elems)
        self.plan()

    def swap_out_partitioned_params(self, dst_fp16_params, src_fp32_params):
        if len(dst_fp16_params) != len(src_fp32_params):
            raise ValueError(f"{len(dst_fp16_params)} params for {len(src_fp32_params)} fp32 sources")
        settle_owed_masters([param.ds_id for param in dst_fp16_params])  # the partitions are about to be written
        with self._lock:
            self.plan()
            try:
                self._end_step_segment()
            except Exception as err:  # noqa: BLE001  a read ahead nobody asked for failed: its bytes are dead (a use
                # reads the file again, and meets its error then); raised here it stopped the update part way, this
                # sub-group's master stepped and its partitions not written (helper-221)
                logger.warning("a partition read ahead and not used failed (%s); the update writes on", err)
            if not self._update_open:  # the update's first write-back: what the last one rewrote is rewritten again
                self._update_open = True
                self._rewritten.clear()
            for param in dst_fp16_params:
                if self._settle_asked(param) or self._drop_read_for_next_step(param.ds_id):
                    try:
                        self.store.release(param.ds_id)
                    except Exception as err:  # noqa: BLE001  its read failed: those bytes are replaced whole below
                        # (raised, it stopped the update with the partition INFLIGHT and no record: helper-149)
                        logger.warning("partition %s: its read failed (%s); the update writes its new bytes whole",
                                       param.ds_id, err)
                    # on file at once, not at its write below: a write of an earlier partition that raised (a full
                    # disk, Ctrl-C) left it INFLIGHT with no record, and a later gather read the placeholder
                    # (helper-207)
                    self._mark_on_file(param)
            for param, source in zip(dst_fp16_params, src_fp32_params):
                self.store.write_from(param.ds_id, source)
                self.partition_writes[param.ds_id] += 1
                self._rewritten.add(param.ds_id)
                param.ds_tensor.status = PartitionedParamStatus.NOT_AVAILABLE
            self._read_ahead_for_next_step()
            self._checked()

    def partition_view(self, param):
        """A view of the host memory of ours holding ``param``'s newest partition bytes (held, lent or being written),
        or None where only its file does (master_write_behind.py writes an fp32 master from it; that module's rule
        keeps it unchanged meanwhile)."""
        with self._lock:
            return self.store.newest_view(param.ds_id)

    def read_partition_into(self, param, into: torch.Tensor) -> Optional[Future]:
        """Fill ``into`` with ``param``'s newest partition bytes: copied from host memory of ours (returns None), or
        read from its file (returns that read, for the caller to wait for). No buffer taken, no use recorded (the
        optimizer's fp32 master filled from partitions some of which are on file: master_copies.py)."""
        with self._lock:
            return self.store.read_newest_into(param.ds_id, into)

    def end_optimizer_step(self):
        """After every optimizer step (stage 3's _post_step). When every partition was resident (kept by the device
        tier), stage 3 wrote all new weights in place and never called swap_out_partitioned_params."""
        with self._lock:
            self._end_step_segment()
            self._read_ahead_for_next_step()
            self._update_open = False
            self._checked()

    def _release_reads_ahead(self, keep=frozenset()):
        """Release the reads ahead nobody asked for, but those of ``keep``; forget the records of partitions whose
        model is gone. Each record is settled before its release, which raises the error of a read that failed: a
        record left AHEAD with no read behind it made the next swap_in wait for none ("no read in flight"), on that
        rank only. Every one is released; the first error is raised after the rest (the others' buffers would stay
        lent otherwise)."""
        failed = None
        for key, record in list(self._partitions.items()):
            if record.read is Read.AHEAD and (key not in keep or record.param() is None):
                record.settle()
                self._read_for_next_step.discard(key)
                try:
                    self.store.release(key)
                except Exception as err:  # noqa: BLE001  (raised below, once every read ahead is released)
                    if failed is not None:  # only the first is raised: the others are said, not dropped
                        logger.error("partition %s: its read ahead failed too (%s)", key, err)
                    failed = failed or err
            if record.param() is None:  # its model is gone (the swapper serves another): nothing asks for it again
                del self._partitions[key]
        if failed is not None:
            raise failed

    def _end_step_segment(self):
        # Reads ahead nobody asked for (the sequence diverged): the step is about to write new weights. Those read
        # during this optimizer step for the next hold the new bytes: they stay.
        failed = None
        self._reads_not_started = []  # positions of the step that ends
        try:
            self._release_reads_ahead(keep=self._read_for_next_step)
        except Exception as err:  # noqa: BLE001  (raised below, once the segment has ended)
            failed = err
        if self._reads_since_write_back:
            self._reads_since_write_back = False
            self.store.next_use = self.profile.end_step()
            self._issued_through = -1  # positions start over
        # Resident partitions get their new weights in place from stage 3 (not through us): those bytes are now
        # the newest, owed to the file. (A partition still being prefetched is finished and released by the
        # caller of swap_out_partitioned_params.)
        self.store.mark_all_lent_changed()
        if failed is not None:
            raise failed

    def partitions_rewritten_in_place(self, params) -> None:
        """stage 3 copied new weights into these partitions in place, resident (``_partitioned_params_swap_out``:
        the AVAILABLE ones, not through us): their bytes are the newest, owed to their files. Marked at once, not
        only when the step ends (``_end_step_segment``): a load's rebuild of the parameters (reset_swap_buffers, the
        rigid load) ends no step, and a partition released clean after the next forward was dropped, and the
        backward read its file's old bytes (helper-149's review)."""
        with self._lock:
            for param in params:
                if self.store.knows(param.ds_id):
                    self.store.mark_changed(param.ds_id)

    def reserve_available_buffers(self):
        # fast_init lends these to the optimizer swapper as fp16 staging; tencache's optimizer swapper reads the
        # fp16 files itself (optimizer_swapper.initialize_from_swapped_fp16_params) and ignores them, but stage 3
        # asserts that the list is not empty: hand it a placeholder, not memory.
        return [self.invalid_buffer]

    def release_reserved_buffers(self):
        pass

    def synchronize_writes(self):
        self.store.flush()

    def add_user(self):
        """An engine's ZeRO-3 optimizer uses this swapper's partitions (install.py, once it is built)."""
        with self._lock:
            self.wake()
            self._users += 1

    def wake(self):
        """A new engine is being built over this swapper's model (install.py, before its optimizer takes its share
        of the host tier): no longer resting. Raises if its files went with its folder (``replaced``)."""
        with self._lock:
            if self.replaced:
                raise TencacheConfigError(
                    f"{self.swap_folder}: this model's parameter swap files were removed when a new zero.Init model "
                    f"took the folder (offload_param.nvme_path) after its engine was destroyed, as stock DeepSpeed "
                    f"removes them; build this model's engine before the new model, or give that one its own "
                    f"nvme_path")
            if self.resting:  # its cache planned anew, from the whole budget (the last governor's cuts went with it)
                self.store.restore_budget()
            self.resting = False

    def release_user(self):
        """An engine over this swapper's partitions was destroyed. Once no engine uses it, it rests: it writes the
        partitions it holds changed, and gives back its slots (pinned memory) and its share of the host tier. It does
        not close: its model may still use it, as stock's does (stock's destroy only takes the hooks off), and
        Accelerate's ``free_memory`` destroys an engine before preparing the same model again (a new engine then
        uses it once more: ``add_user``; slots are planned anew at its first swap). A new zero.Init model in its
        folder gets a swapper of its own (``__new__``). Files, I/O threads and the folder lock stay until it is
        garbage collected with its model, or ``close``."""
        # (close settles too: here first, outside the lock the writes' views take). Its error is raised once the
        # swapper rests: a master file stale for good must not keep the slots and the host tier's share.
        settle_error = _owed_masters_settled()
        with self._lock:
            self._users -= 1
            if self._users <= 0 and not self.closed:
                self._rest()
        if settle_error is not None:
            raise settle_error

    def rest_unless_used(self):
        """An engine's build woke this resting swapper (``wake``) and failed before it took a user: back to rest
        where no engine uses it, as its last destroy left it (install.py; helper-242's review: left awake with no
        user, it held its slots and counted as live, and a new zero.Init model in its folder with another block was
        refused for an engine that no longer existed)."""
        with self._lock:
            if self._users <= 0 and not self.closed and not self.resting:
                self._rest()

    def _rest(self):
        self.resting = True
        # reads ahead for a step that no engine will run (those of the last optimizer step for the next) go back
        # with their slots
        self._release_reads_ahead()
        # the newest weights of partitions held changed (write-back) to their files; those stage 3 keeps gathered
        # (persistent parameters) stay lent, the model's
        self.store.flush(lent_stay=True)
        if not self.store.give_back_slots():
            logger.info("%s: a partition is still lent after its last engine was destroyed: the slots stay",
                        self.swap_folder)

    def close(self):
        """Wait for I/O in flight and give back slots, pinned memory, I/O threads and the folder. Dirty partitions
        are not written: nothing uses them any more (tests close; an engine's destroy puts the swapper to rest:
        ``release_user``)."""
        settle_error = _owed_masters_settled()  # masters written from these partitions first
        with self._lock:
            with TencacheParamSwapper._instances_lock:
                if TencacheParamSwapper._instances.get(self.swap_folder) is self:
                    del TencacheParamSwapper._instances[self.swap_folder]
            if not self.closed:
                try:
                    self.store.close()
                finally:
                    self._finalizer.detach()
                    _let_go(self.io, self._folder_key)
                    self.closed = True
        if settle_error is not None:
            raise settle_error

    # ---------------------------------------------------------------------------------------------- stats
    def stats(self) -> dict:
        counters = self.io.counters()
        stats = {f"param_{key}": value for key, value in self.store.stats().items()}
        stats["param_profile"] = self.profile.source
        stats["param_profile_phase"] = self.profile.phase.value
        stats["param_profile_divergences"] = self.profile.divergences
        stats["param_scheduled_reads"] = self.scheduled_reads
        stats["param_update_reads"] = self.update_reads
        stats["param_swapper_closed"] = int(self.closed)
        stats["param_swapper_resting"] = int(self.resting)
        stats.update(param_nvme_read_bytes=counters.read_bytes, param_nvme_write_bytes=counters.write_bytes,
                     host_cache_budget_bytes=self.budgets.host_cache_bytes,
                     stock_param_pinned_bytes_estimate=self.stock_pinned_bytes_estimate())
        return stats

    def stock_pinned_bytes_estimate(self) -> int:
        """What AsyncPartitionedParameterSwapper locks for the same config: its slot pool plus the write-back
        staging area of the largest sub-group (partitioned_param_swapper.py _configure_aio and
        reserve_partitioned_swap_space)."""
        intra_op = int(self.aio_config.get("intra_op_parallelism", 1))
        slots = self.param_buffer_count * io_aligned_numel(int(self.elements_per_buffer), self.dtype, intra_op)
        staging = sum(io_aligned_numel(numel, self.dtype, intra_op) for numel in self.largest_partition_numels)
        return (slots + staging) * self.swap_element_size

    def host_param_capacity(self, cache_bytes=None) -> int:
        """Bytes of partitions the host tier can keep lent at once without starving the rest: all of its slots when
        every partition fits in them (nothing else needs one), else the cache slots beyond streaming. ``cache_bytes``:
        for a cache of that size instead of the current one (a resize about to happen)."""
        self.plan()  # every partition size is known by the first complete trace
        cache = self.store.cache_bytes_reserved if cache_bytes is None else int(cache_bytes)
        committed = self.store.streaming_bytes_reserved + cache
        needed = sum(self.store.swap_nbytes(numel) for _key, numel in self.store.numels())
        return committed if committed >= needed else cache

    # ------------------------------------------------------------------------------------------- planning
    def plan(self):
        """Reserve slots for newly seen partitions; the first time, also look for a saved profile of them. After
        partitions were handed over to stage 3 (``swap_into_buffer``: one after the other, at start-up), the slots go
        back first, once, so that the arena is planned for those still swapped only: given back at each hand-over,
        the arena was mapped, locked (and on a GPU registered) anew for every partition stage 3 took (helper-149's
        review)."""
        if self._handed_over:
            self._handed_over = False
            self.store.give_back_slots()
        self._plan_slots()

    def _plan_slots(self):
        self.store.plan()
        if not self._profile_looked_up:
            self._profile_looked_up = True
            self.store.next_use = self.profile.load(self.store.numels(), dtype=str(self.dtype),
                                                    world_size=dist.get_world_size(), **self._sequence_facts)

    # ---------------------------------------------------------------------------------------- read ahead
    def _current_schedule(self):
        """The prefetch schedule of the current profile while it predicts this step (else None: demand only)."""
        lifecycle = self.profile
        if lifecycle.phase is not Phase.PREDICTING or lifecycle.profile is None:
            return None
        if self._schedule_generation != lifecycle.generation:
            self._schedule_generation = lifecycle.generation
            profile = lifecycle.profile
            # No read in the profile (everything held): nothing to plan. Reads' times come from the profile.
            self._schedule = PrefetchSchedule.from_profile(profile, within_step=True) \
                if profile.measured_read_bytes_per_s is not None else None
            self._tail_read_keys = () if self._schedule is None else \
                tuple(profile.keys[position] for position in self._schedule.tail_reads)
        return self._schedule

    def _read_ahead_by_schedule(self):
        """Start the reads the schedule says are due at the current access (only this step's: the optimizer
        step rewrites every partition before the next), where a buffer is free now or can be made so
        (``_start_read_ahead``)."""
        schedule = self._current_schedule()
        if schedule is None:
            return
        position, keys = self.store.recorder.position, self.profile.profile.keys
        # a read that found no buffer (one being written out for it, say: EntryStore.prefetch_if_free) is tried
        # again at the next calls until its use; the reads issued at this position (several calls come at one), and
        # at every position passed since the last call: one swap-in records a whole gather bucket's accesses, and the
        # reads due in between were never issued (helper-162's review: 3 of 21 with buckets of 3)
        if position < self._issued_through:  # (a step began that no segment's end told of)
            self._issued_through = -1
        since, self._issued_through = min(self._issued_through + 1, position), position
        due = dict.fromkeys(target for target in self._reads_not_started if target > position)
        due.update(dict.fromkeys(target for passed in range(since, position + 1)
                                 for target in schedule.to_issue(passed) if target > position))
        self._reads_not_started = []
        if not due:
            return
        for target in due:
            if self._start_read_ahead(keys[target], make_room=True):
                self.scheduled_reads += 1
            elif self.store.state(keys[target]) is EntryState.ON_FILE:  # no buffer for it yet
                self._reads_not_started.append(target)

    def _read_ahead_for_next_step(self):
        """During the optimizer step: start reading the next step's first partitions that its schedule cannot read
        in time within it (PrefetchSchedule.tail_reads), each once its new bytes are on file, where a buffer is free
        now (never waits, never evicts; a partition still being written is tried again at the next call). A read
        before its partition's write would read the old bytes, so only the rewritten ones are read. Their records
        stay AHEAD past the step's end; the next step's swap-in waits for them as for any read ahead."""
        if not self._rewritten or self._current_schedule() is None:
            return
        # As many as DeepSpeed's depth leaves buffers for, less one: the update's writes and the step's first asks
        # take slots of the same classes, and starved of them they fall back to pageable memory (measured: every
        # read the schedule lists at once took them)
        room = int(self.param_buffer_count) - 1 - self.store.lent_or_reading()
        for key in self._tail_read_keys:
            if room <= 0:
                return
            if key in self._rewritten and self._start_read_ahead(key):
                self._read_for_next_step.add(key)
                self.update_reads += 1
                room -= 1

    def _start_read_ahead(self, key, make_room: bool = False) -> bool:
        """Read ``key`` ahead of DeepSpeed's ask where it is on file with no read of ours pending and a buffer is
        free now, or (``make_room``) held by a partition needed after it (EntryStore.prefetch_if_free: never waits,
        evicts nothing needed sooner); DeepSpeed is not told (NOT_AVAILABLE)."""
        record = self._partitions.get(key)
        param = None if record is None else record.param()
        if param is None or record.read is not Read.NONE or \
                param.ds_tensor.status != PartitionedParamStatus.NOT_AVAILABLE:
            return False
        if not self.store.prefetch_if_free(key, make_room=make_room):
            return False
        record.read = Read.AHEAD
        return True

    def _drop_read_for_next_step(self, key) -> bool:
        """``key`` gets new bytes again before the step its read ahead was for (a second optimizer step with no
        forward between, a checkpoint's load rebuilding the partitions): True if that read, now stale, is to be
        released."""
        if key not in self._read_for_next_step:
            return False
        self._read_for_next_step.discard(key)
        self._partitions[key].settle()
        return True

    def _step_reads_begin(self, params):
        """A swap-in of ``params``. Unless they are all persistent (stage 3 gathers those again at the update's end,
        before end_optimizer_step: the first accesses of the next step's profile, not a step of their own, which
        became the profile, every training step leaving it at its first access: helper-169, helper-180), the step has
        begun: the reads started during the optimizer step for it become ordinary reads ahead (released at the next
        optimizer step if never asked for)."""
        if not all(getattr(param, "ds_persist", False) for param in params):
            self._reads_since_write_back = True
            self._update_open = False  # (a checkpoint's load rebuilds the partitions with no end_optimizer_step)
            self._read_for_next_step.clear()

    # -------------------------------------------------------------------------------------------- private
    def _mark_on_file(self, param):
        param.ds_tensor.data = self.invalid_buffer.data
        param.ds_tensor.status = PartitionedParamStatus.NOT_AVAILABLE

    def _settle_asked(self, param) -> bool:
        """DeepSpeed no longer waits for ``param``'s read (it released or rewrote the partition first): True if it
        was asked for."""
        record = self._partitions.get(param.ds_id)
        if record is None or not record.read.asked:
            return False
        record.settle()
        return True

    def check_records(self):
        """The partition records' invariants (partition_record.check_records), and every partition read for the
        next step is read ahead; after every call under TENCACHE_DEBUG_CHECKS=1."""
        with self._lock:
            self._check_records_locked()

    def _checked(self):
        if self._debug_checks:
            self._check_records_locked()

    def _check_records_locked(self):
        check_records(self._partitions)
        for key in self._read_for_next_step:
            record = self._partitions.get(key)
            assert record is not None and record.read is Read.AHEAD and record.param() is not None, \
                f"partition {key}: read for the next step but {None if record is None else record.read.value}"


def _owed_masters_settled() -> Optional[Exception]:
    """Settle every optimizer's owed masters (master_write_behind.py), returning the error instead of raising it: the
    caller lets go of what it holds first (a master file stale for good must not keep I/O threads, files, slots or
    the folder lock), then raises it."""
    try:
        settle_owed_masters()
    except Exception as err:  # noqa: BLE001  (raised by the caller)
        return err
    return None


def _persisted_gather_in_flight(param) -> bool:
    """``param``'s gather has started (INFLIGHT: __all_gather_params releases persisted parameters' partitions right
    after starting it) and reads its partition in place: on a host accelerator the collective's input is the
    partition itself, read on the collective's own thread after this returns (at 2 ranks gloo read the placeholder:
    "out->size == in->size * context->size"; helper-195), and at one rank the gathered tensor is a view of it. Not a
    partitioning's release: there (_partition_param with free_data False, a leaf module's) stage 3 replaces the view
    right after, and a partition kept lent then stayed so for good (helper-188's review). On a GPU the gather reads
    a device copy of the partition, fenced at the release (``_device_copy_fence``)."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus  # (at call time: _is_gathered)
    if getattr(param, "ds_status", None) != ZeroParamStatus.INFLIGHT or param.ds_tensor is None:
        return False
    data, partition = param.data, param.ds_tensor
    if getattr(partition, "status", None) != PartitionedParamStatus.AVAILABLE:  # (on file already: nothing to keep)
        return False
    return accelerator_is_host() or (data.numel() > 0 and data.device == partition.device and
                                     data.data_ptr() == partition.data_ptr())


def _is_gathered(param) -> bool:
    # partition_parameters imports this module (through install.py) while it is being imported itself: its
    # ZeroParamStatus is looked up at call time
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    return getattr(param, "ds_status", None) == ZeroParamStatus.AVAILABLE


def rewritten_in_place(params, partitions) -> None:
    """Of a sub-group's parameters and their partitions (stage 3's ``fp16_groups[i]``, ``fp16_partitioned_groups[i]``)
    after stage 3 copied new weights into the resident ones: tell the swappers of ours that hold them
    (``partitions_rewritten_in_place``)."""
    by_swapper = {}
    for param, partition in zip(params, partitions):
        swapper = getattr(param, "nvme_swapper", None)
        if isinstance(swapper, TencacheParamSwapper) and partition.status == PartitionedParamStatus.AVAILABLE:
            by_swapper.setdefault(id(swapper), (swapper, []))[1].append(param)
    for swapper, rewritten in by_swapper.values():
        swapper.partitions_rewritten_in_place(rewritten)


class _Fences:
    """Events that must all have passed before a slot is reused (the pool calls ``synchronize``)."""

    def __init__(self, *events):
        self._events = events

    def synchronize(self) -> None:
        for event in self._events:
            event.synchronize()


def _device_copy_fence(params=(), copies_on=None):
    """A CUDA event after the copies queued so far on the current stream (None without CUDA). DeepSpeed copies
    a partition to the device with non_blocking=True; over registered memory that copy is truly asynchronous, so the
    slot may not be reused before this event. The copy itself runs on the coordinator's all-gather stream, not this
    one: an event here still comes after it where a partition is released only after its gather was waited for,
    and that wait makes the current stream wait for the all-gather stream (partitioned_param_coordinator.py,
    fetch_sub_module: ``current_stream().wait_stream(allgather_stream)`` on CUDA, where data dependencies are not
    resolved by the device). Persisted parameters on NVMe are released right after their gather starts, before any
    wait (``__all_gather_params``: "Release swap buffers for persisted params on nvme"): where one of ``params`` is
    still INFLIGHT the device is synchronised first, all its streams, so that the event comes after that copy too
    (rare: a persisted parameter is gathered once and stays). ``copies_on``: a stream whose copies from the
    partitions may not be ordered before the current stream's (a gather in flight at a step's reset_step, waited for
    on the current stream alone: NoGatherCoalescedHandle.wait, then kept by the device tier: helper-185): an event
    after its copies too."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus  # (at call time: _is_gathered)
        if any(getattr(param, "ds_status", None) == ZeroParamStatus.INFLIGHT for param in params):
            torch.cuda.synchronize()
        event = torch.cuda.Event()
        event.record()
        if copies_on is None:
            return event
        on_copies = torch.cuda.Event()
        on_copies.record(copies_on)
        return _Fences(event, on_copies)
    return None


def _let_go(io: DirectFileIO, folder_key: str, wait: bool = True) -> None:
    """A swapper's I/O threads and folder lock, given back (also its finalizer, which must not hold the swapper and
    may run in any thread: ``wait`` False there)."""
    try:
        io.close(wait)
    finally:
        folder_lock.let_go(folder_key)


def _numel(param) -> int:
    return param.ds_tensor.ds_numel


def _swap_folder(ds_config, model_dtype) -> str:
    dtype_name = str(model_dtype).split(".")[1]
    return os.path.join(ds_config.zero_config.offload_param.nvme_path, "zero_stage_3", f"{dtype_name}params",
                        f"rank{dist.get_rank()}")


def live_swappers():
    """Every live TencacheParamSwapper an engine uses or a zero.Init model is being built on (usually one: one per
    nvme_path, dtype and rank); not those resting (``release_user``), whose slots another engine must not plan."""
    return [swapper for swapper in list(TencacheParamSwapper._instances.values())
            if not getattr(swapper, "resting", False)]


def dtype_of_swap_file(path: str) -> torch.dtype:
    """The element type of a partition file written by one of our live swappers (for fast_init's reader)."""
    folder = os.path.dirname(path)
    for swapper in list(TencacheParamSwapper._instances.values()):
        if swapper.swap_folder == folder:
            return swapper.dtype
    raise FileNotFoundError(f"{path} does not belong to a live tencache parameter swapper")
