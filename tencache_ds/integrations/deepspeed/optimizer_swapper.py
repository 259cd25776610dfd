"""DeepSpeed's optimizer swapper over tencache's host tier. Owns: translating the calls ZeRO-3 makes on its
optimizer swapper (deepspeed-integration.md, a.6) into OptimizerStore calls, and keeping DeepSpeed's view of each
sub-group consistent (the ``.data`` of its fp32 master and state tensors, ``.grad``, ``swap_params_info``). The
store (streaming slots, host-tier share, footprint arithmetic) is cache/optimizer_store.py; entry states, I/O and
eviction live in cache/entry_store.py; the masters the parameter partitions hold, masters_in_partitions.py; the
reads started before the update asks, cache/optimizer_reads_ahead.py; the gradients handed and lent,
optimizer_gradients.py.

What changes for users:
- Zero copies on a hit: a swap-in lends the held buffers themselves as the sub-group's fp32 master, Adam moments
  and gradient; a swap-out takes them back, changed. When the tier holds everything, a step moves the bytes stock
  CPU offload moves (one copy of each gradient fragment into its sub-group's gradient buffer, and nothing else).
- Write-back: changed state reaches its file when evicted, when a checkpoint is saved (the engine reads
  ``swap_folder`` just before it copies the folder: the property flushes first), when a checkpoint is loaded,
  and at close. In steady state with everything held, nothing is written per step (stock: all optimizer state).
- No NVMe round trip for gradients, and no copy of them in the backward: stage 3 keeps each one in a host buffer
  until the update, and the update copies it from there (stage3_gradients.py, cache/gradient_fragments.py). Stock
  writes every gradient and reads it back each step.
- File layout is stock's (``<ds_id>.tensor.swp``, ``<state>-<ds_id>.tensor.swp``), so checkpoints copy it file by
  file; a sub-group's gradient fragments share one file (``<ds_id>_gradient_0_<numel>.tensor.swp``), which
  checkpoints skip as they skip stock's.
- Buffers are 4 KiB-aligned *pageable* memory (only the CPU optimizer and file I/O touch them); beyond the budget a
  sub-group is served from a transient buffer, never from an assertion (stock: `assert pinned_buffers is not
  None`, or "PipelinedOptimizerSwapper ran out of swap buffers" below 12 buffers).
- The next sub-group (``async_parameter``) is read ahead while the current one steps.
- No read of an fp32 master the parameter partitions hold: where they are in the masters' dtype (fp32 training)
  and the parameter swapper holds them, the update fills the master from them (masters_in_partitions.py). Stock
  reads it.
"""
import contextlib
import dataclasses
import functools
import os
import shutil
import weakref
from typing import Optional

import torch
from deepspeed.runtime.swap_tensor.optimizer_utils import OptimizerStateSwapInfo, OptimizerSwapper
from deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper import PartitionedOptimizerSwapper
from deepspeed.runtime.swap_tensor.pipelined_optimizer_swapper import PipelinedOptimizerSwapper
from deepspeed import comm as dist

from ...config import CONFIG_KEY
from ...errors import TencacheConfigError, TencacheError
from ...ext_lock import raise_if_stale_locks
from ...cache.entry import CACHED
from ...cache.optimizer_store import OptimizerStore
from ...cache.state_dtype import NARROWING_KIND, narrow_stock_layout, stored_numel, viewed_as
from ...io.direct_io import DirectFileIO, store_io_threads
from ...io import folder_lock
from ...io.shared_files import TEMPORARY_KIND, LinkSafeIO, unshare_folder
from ...io.stale_files import hidden_name, remove_hidden_files_of_dead_processes
from ...memory.pool import BufferPool
from ...log import logger
from ...plan.workload import optimizer_pipelining
from ...probes.limits import local_world_size
from ...units import fmt_bytes
from ...profile.lifecycle import ProfileLifecycle
from ...zero_sections import optimizer_state_dtype_message
from .profiling import profile_section, rank_profile_path
from .config_bridge import (DEEPSPEED_OPS, MIN_SWAPPABLE_BYTES, find_stage3_ds_config, find_stage3_optimizer,
                            initialize_call_config, io_aligned_numel, prepare_swap_folder, swap_folder_held,
                            validate_ds_config)
from . import param_swapper
from .host_tier_share import optimizer_host_share
from .masters_in_partitions import MastersInPartitions
from .node_ranks import count_ranks_on_node
from ...cache.optimizer_reads_ahead import ReadsAhead
from .optimizer_gradients import SubGroupGradients, gradient_path
from .agreement import built_on_every_rank, raised_on_every_rank
from .swap_files import (ADOPTING_KIND, LOAD_REFUSED, SWAP_FILE_NAME, STAGED_LOAD_KIND, LoadPlaces, is_staged_load,
                         staged_load_name, swap_file_name)

NVME_PATH_KEY = "zero_optimization.offload_optimizer.nvme_path"
# A sub-group whose optimizer has not made its state yet is counted with Adam's two moments, the most DeepSpeed's
# CPU optimizers keep (DeepSpeedCPULion allocates two as well; Adagrad and Muon keep one).
UNREGISTERED_STATES = 2


def _remove_what_killed_runs_left(folder: str, held: bool) -> None:
    """The hidden files a process killed in a checkpoint save or load, or in a copy before a write, left in the swap
    folder (whole swap files, or links keeping a deleted checkpoint's blocks): nothing else removes them, since the
    folder outlives runs (stock's is never emptied either). ``held``: this process holds the folder's lock (every
    other process's are left files). Best effort: a folder that cannot be read is logged."""
    try:
        removed = remove_hidden_files_of_dead_processes(
            folder, (TEMPORARY_KIND, STAGED_LOAD_KIND, ADOPTING_KIND, NARROWING_KIND), held)
    except OSError as err:
        logger.warning("optimizer swap folder %s: the files killed runs left there could not be removed (%s)",
                       folder, err)
        return
    for path in removed:
        logger.info("removed %s, left in the swap folder by a run that was killed", path)


def _links_into(path: str, folder: str) -> bool:
    """Can ``path`` be hard-linked into ``folder``? Tried (and undone): one file system is not enough, a link across
    two mounts of it (a container's bind-mounted volumes) fails with EXDEV, and one to another user's file may be
    refused (fs.protected_hardlinks: helper-164's review)."""
    probe = os.path.join(folder, hidden_name(os.path.basename(path), TEMPORARY_KIND))
    try:
        os.link(path, probe)
    except OSError:
        return False
    os.unlink(probe)
    return True


def _refuse_without_config() -> None:
    """No ZeRO-3 optimizer config could be found for this swapper (an optimizer built without stage 3's wrapped
    __init__, contract.CALL_ORDER): stock is right only if nothing says tencache. Where the deepspeed.initialize
    call's config enables it, or the parameters are swapped by tencache, a stock optimizer swapper would be a
    silent fallback: refuse instead."""
    initialize_config = initialize_call_config()
    if (initialize_config is not None and initialize_config.enabled) or param_swapper.live_swappers():
        raise TencacheConfigError(
            f'{CONFIG_KEY}: the DeepSpeed config enables tencache, but the config of the ZeRO-3 optimizer being '
            f"built could not be found (it was not built by DeepSpeedZeroOptimizer_Stage3.__init__ with a "
            f"ds_config), so its optimizer swapper cannot be tencache's; build the optimizer through "
            f"deepspeed.initialize, or set \"{CONFIG_KEY}\": {{\"enabled\": false}} to run stock DeepSpeed")


def _refuse_states_of_another_dtype(optimizer, dtype: torch.dtype) -> None:
    """The optimizer tier stores every tensor of a sub-group in the masters' dtype. DeepSpeed's CPU optimizers keep
    their state in fp32 beside bf16 or fp16 masters (``bf16.bf16_master_weights_and_grads`` without
    ``bf16_optimizer_states``, ``fp16.fp16_master_weights_and_grads``) unless built with
    ``fp32_optimizer_states=False``: that state would be narrowed to the masters' dtype, other results than stock
    CPU offload's (found with gpt2-tiny: other losses from the third step; stock NVMe stops on an assertion there).
    Refused before any folder is made (config_bridge refuses the optimizer DeepSpeed builds earlier still). A state
    tensor the optimizer creates in another dtype itself is judged when DeepSpeed registers it
    (``TencacheOptimizerSwapper._update_param_state_info``): a narrower one (Muon's momentum) is stored as its own
    bytes, a wider one refused."""
    if dtype != torch.float32 and getattr(optimizer, "fp32_optimizer_states", False):
        name = type(optimizer).__name__
        master_key = "fp16.fp16_master_weights_and_grads" if dtype == torch.float16 else \
            "bf16.bf16_master_weights_and_grads"
        raise TencacheConfigError(optimizer_state_dtype_message(
            master_key, name, f"construct {name} with fp32_optimizer_states=False (the state in the masters' dtype)"))


def _refuse_state_made_at_construction(optimizer, largest_numel: int, dtype: torch.dtype, aio_config) -> None:
    """A client ``torch.optim.Adagrad`` (``deepspeed.initialize(optimizer=...)``): stage 3 builds a new one over the
    sub-groups' masters once its start-up has swapped them out (initialize_optimizer_states), and torch's Adagrad
    makes its state at construction, so its "sum" is empty and the first step stops on a size mismatch ("The size of
    tensor a (0) must match ...": stock DeepSpeed's NVMe offload too; helper-240's review). Refused before any folder
    is made, naming what runs: the optimizer named in the config, which DeepSpeed builds as DeepSpeedCPUAdagrad
    (its state made at its first step), or the optimizer on the CPU. Only where a sub-group is swapped at all (the
    largest reaches the swap threshold, ``min_aio_bytes``): below it every master stays in memory and the rebuilt
    Adagrad trains, stock NVMe's as well (helper-242's review)."""
    swapped_bytes = largest_numel * torch.empty((), dtype=dtype).element_size()
    if isinstance(optimizer, torch.optim.Adagrad) and swapped_bytes >= _min_aio_bytes(aio_config):
        raise TencacheConfigError(
            f'offload_optimizer.device "nvme" with a client {type(optimizer).__module__}.{type(optimizer).__name__} '
            f'(deepspeed.initialize(optimizer=...)): stage 3 rebuilds it over the sub-groups after swapping them '
            f'out, it makes its state then, empty, and the first step stops on a size mismatch (stock DeepSpeed '
            f'too). Name it in the config instead, "optimizer": {{"type": "Adagrad", "params": {{...}}}} (DeepSpeed '
            f'builds DeepSpeedCPUAdagrad, whose state tencache swaps), or set offload_optimizer.device to "cpu"')


def _min_aio_bytes(aio_config) -> int:
    """The least bytes of a swapped tensor (stock's ``min_aio_bytes``): a smaller sub-group stays in memory."""
    return max(MIN_SWAPPABLE_BYTES, int(aio_config.get("block_size", 0)))


def _unshare_when_the_process_ends(swapper_ref, owner_pid: int) -> None:
    """At exit (weakref.finalize), for a swapper never closed: its names still shared with a checkpoint leave the
    folder (what close() does; nothing else of it runs then: the tier's state dies with the process). A swapper
    collected without close() is gone: nothing is known of its files then. A child forked from the process that
    made the swapper inherits the handler: it leaves the files to their owner, still training on them. Never
    raises: the process is ending."""
    swapper = swapper_ref()
    if swapper is None or swapper.closed or os.getpid() != owner_pid:
        return
    try:
        removed = unshare_folder(swapper.files_folder, swapper.owns_file)
    except OSError as err:
        logger.warning("optimizer swap folder %s: its files shared with a checkpoint could not be removed at exit "
                       "(%s); a stock DeepSpeed run in this nvme_path would write into that checkpoint",
                       swapper.files_folder, err)
        return
    if removed:
        logger.info("optimizer swap folder %s: %d files shared with a checkpoint removed at exit",
                    swapper.files_folder, removed)


IN_STEP_ATTRIBUTE = "_tencache_in_step"  # on a ZeRO-3 optimizer, True while its step() runs (install.py)


class TencacheOptimizerSwapper(PartitionedOptimizerSwapper):
    """Stands in for both PartitionedOptimizerSwapper and PipelinedOptimizerSwapper in stage3's namespace
    (subclass: stage 3 calls ``OptimizerSwapper.parameter_id`` through the base class)."""

    def __new__(cls, swap_config, aio_config, base_folder, optimizer, largest_numel, device, dtype, timers):
        count_ranks_on_node()  # (a collective: ZeRO-3's __init__ builds the swapper on every rank, its device set)
        return built_on_every_rank(lambda: cls._new(swap_config, aio_config, base_folder, optimizer, largest_numel,
                                                    device, dtype, timers), "optimizer swapper")

    def __init__(self, swap_config, aio_config, base_folder, optimizer, largest_numel, device, dtype, timers):
        # pylint: disable=super-init-not-called
        built_on_every_rank(lambda: self._build(swap_config, aio_config, base_folder, optimizer, largest_numel,
                                                device, dtype, timers), "optimizer swapper")

    @classmethod
    def _new(cls, swap_config, aio_config, base_folder, optimizer, largest_numel, device, dtype, timers):
        ds_config = find_stage3_ds_config()
        config = validate_ds_config(ds_config)  # before any folder is written
        if ds_config is None:
            _refuse_without_config()
        if not config.enabled:
            stock = PipelinedOptimizerSwapper if swap_config.pipeline else PartitionedOptimizerSwapper
            return stock(swap_config=swap_config, aio_config=aio_config, base_folder=base_folder,
                         optimizer=optimizer, largest_numel=largest_numel, device=device, dtype=dtype, timers=timers)
        _refuse_states_of_another_dtype(optimizer, dtype)
        _refuse_state_made_at_construction(optimizer, largest_numel, dtype, aio_config)
        swapper = super().__new__(cls)
        swapper.config = config
        return swapper

    def _build(self, swap_config, aio_config, base_folder, optimizer, largest_numel, device, dtype, timers):
        # The stock constructors lock buffer_count x largest_numel through DeepSpeed's aio handle; what else they
        # set up (the attributes the base class's helpers read) is set here.
        raise_if_stale_locks(ops=DEEPSPEED_OPS)
        intra_op = int(aio_config.get("intra_op_parallelism", 1))
        self.swap_config = swap_config
        self.aio_config = aio_config
        self.swap_params_info = {}
        self.swap_element_size = torch.empty((), dtype=dtype).element_size()
        self._folder = os.path.join(base_folder, "optimizer", f"rank{dist.get_rank()}")
        with swap_folder_held(self._folder, swap_config.nvme_path, NVME_PATH_KEY) as self._folder_key:
            prepare_swap_folder(self._folder, swap_config.nvme_path, NVME_PATH_KEY)
            _remove_what_killed_runs_left(self._folder, folder_lock.locked(self._folder_key))
            self.optimizer = optimizer
            self.min_aio_bytes = _min_aio_bytes(aio_config)
            self.aligned_bytes = 1024 * intra_op
            self.numel_alignment = self.aligned_bytes // self.swap_element_size
            self.largest_numel = io_aligned_numel(largest_numel, dtype, intra_op)
            self.dtype = dtype
            self.io = DirectFileIO(num_threads=store_io_threads(intra_op), name="tencache-optim-io")
            # LinkSafeIO: a swap file linked into a checkpoint (checkpoint_save.py) is replaced, never written in place
            self.store = OptimizerStore(dtype, lambda numel: io_aligned_numel(numel, dtype, intra_op),
                                        LinkSafeIO(self.io), self.largest_numel, int(swap_config.buffer_count),
                                        lambda: optimizer_host_share(self.config, self.optimizer, self))
            self.pool, self.budget = self.store.pool, self.store.budget  # what memory pressure and stats read
            self.last_folder_transfer = None  # what the last checkpoint save or load of the folder did
            self.last_zero_file_save = None  # what the last ZeRO file saved in two passes cost (io/save_from_files.py)
            self.checkpoint_totals = CheckpointTotals()  # what checkpoint saves and loads did, in all (in stats())
            # The optimizer's tensors are used in the same order every step. log_timers() ends each step; the first
            # call ends initialisation, the second the first training step, in which Adam creates its moments (stored
            # new: a different sequence, never repeated). The second training step is the first that repeats: it
            # becomes the profile (recording the first would cost two more steps of demand fetching before the
            # lifecycle saw the change repeat and adopted it).
            profile_file = rank_profile_path(self.config.profile_path)
            self.profile = ProfileLifecycle(self.store.recorder, profile_file,
                                            profile_section("optimizer", profile_file, self), first_training_step=2,
                                            to_file=os.path.basename,
                                            from_file=lambda name: os.path.join(self._folder, name))
            self.timers = timers
            self.timer_names = set()
            # reading ahead (cache/optimizer_reads_ahead.py) and writing behind: on unless pipeline_read or
            # pipeline_write is false explicitly (plan/workload.py)
            explicit = getattr(swap_config, "model_fields_set", set())
            self.reads_ahead, self.writes_behind = optimizer_pipelining(
                {key: getattr(swap_config, key) for key in ("pipeline_read", "pipeline_write") if key in explicit})
            self._lent = {}        # sub-group id -> keys of the entries lent as its tensors (and gradient)
            # sub-groups the step running now has updated, and how many the last step had when it stopped part way
            # (0: it ended; else a save is of no whole step: ``check_none_lent``)
            self._updated_in_step = 0
            self.update_stopped_part_way = 0
            # path -> the error of a new state's first store (``_store_new_state``), and sub-group -> such a path
            self._lost_states, self._lost_groups = {}, {}
            self._state_dtypes = {}  # path -> dtype of a state tensor not in the masters' (_update_param_state_info)
            # the reads started before the update asks: in backward, and the next sub-group's during each update
            self.ahead = ReadsAhead(self.store, self._paths_to_read, gradient_path)
            self._backwards_this_step = 0  # backward passes since the last optimizer step ended (log_timers)
            stage3 = find_stage3_optimizer()
            self._stage3 = weakref.ref(stage3) if stage3 is not None else None  # (it holds this swapper)
            # the gradients stage 3 hands: read from its own gradient buffer at the update where it keeps them,
            # stored otherwise (optimizer_gradients.py)
            self.gradients = SubGroupGradients(stage3, self.store, dtype)
            # the fp32 masters that the parameter partitions, held by the parameter swapper, hold too: filled from
            # there instead of read, and their files written from there only where something needs them, not in the
            # update (masters_in_partitions.py)
            self.masters = MastersInPartitions(stage3, dtype, LinkSafeIO(self.io).write, self.writes_behind)
            # a master whose file is behind its partitions is read from them, ahead of its update or at it, never
            # from its file
            self.store.read_from_copies(self._owed_master_fill)
            # the backward passes of one optimizer step: stage 3's gradient accumulation (set before it builds its
            # swappers) until a step has counted them (log_timers), which the caller's own boundaries may change
            self._micro_steps = max(1, int(getattr(stage3, "gradient_accumulation_steps", 1) or 1))
            self._checkpoint_load_pending = False  # the engine's load_checkpoint is running (loading_checkpoint)
            self._load_places = LoadPlaces.ALL  # ... and what its copy of the checkpoint's files places
            self._stage_every_loaded_file = False  # ... and whether it places them all hidden (begin_load_copy)
            self._stage_own_files = True  # ... and this engine's own until all are placed (begin_load_copy)
            self._before_load_copy = None  # ... settled when the copy starts (begin_load_copy)
            self.last_load_places: Optional[LoadPlaces] = None  # what the last load's copy placed (None: no copy)
            self.last_load_source: Optional[str] = None  # ... from which folder (the checkpoint's, for this rank)
            self._drop_held_copies = False  # a checkpoint was copied over the folder: drop every held copy first
            self._profile_looked_up = False
            self._deferred = None  # parameters whose release waits for a fragment getter's read (releases_deferred)
            self._getter_swap_ins = None  # parameters a fragment getter or setter swapped in (releases_deferred)
            self._fragment_reads_gradient = True  # does the fragment call inside releases_deferred read .grad?
            self.fragment_swap_ins_without_gradient = 0  # COUNT: (releases_deferred, reads_gradient false)
            self.closed = False
            # A run that ends without engine.destroy() (most training scripts) never closes this swapper: its files
            # still shared with a checkpoint are removed from the folder when the process ends instead, so that a
            # later stock run in this nvme_path (its aio writes existing files in place, and it does not empty the
            # folder) cannot reach the checkpoint through them. (A killed process leaves them: docs/reliability.md.)
            self._unshare_at_exit = weakref.finalize(self, _unshare_when_the_process_ends, weakref.ref(self),
                                                     os.getpid())
            self.print_exclude_list = ["optimizer", "swap_params_info", "timers", "timer_names", "print_exclude_list",
                                       "io", "pool", "config", "store", "budget", "_unshare_at_exit"]

    @property
    def files_folder(self) -> str:
        """The swap files' folder, without the checkpoint flush of ``swap_folder``."""
        return self._folder

    # ------------------------------------------------------------------------------ the checkpoint contract
    @property
    def swap_folder(self) -> str:
        """The folder of the swap files. The engine reads this attribute right before it copies the folder into a
        checkpoint (engine.py save_checkpoint) or copies a checkpoint over it (load_checkpoint): under write-back
        the files must hold the newest bytes then, so reading it flushes the changed state first."""
        if not self.closed:
            if not self._checkpoint_load_pending:  # a save (a load replaces the files); checked at its start too
                self.check_no_master_lent_behind()
            self.settle_master_writes()
            # Gradients are dead after the step and checkpoints skip their files: a held one stays dirty.
            self.store.flush(skip=self._gradient_keys().__contains__)
            # On a load the engine then copies the checkpoint's files over these, so any copy held now may be
            # stale, and no file timestamp says which for sure (a copy within one clock tick of the flush leaves
            # inode, size and ctime as they were): the next swap-in, the first after the copy, drops them all.
            # A save changes no file: the copies stay.
            if self._checkpoint_load_pending:
                self._drop_held_copies = True
        return self._folder

    def _gradient_keys(self) -> set:
        return {gradient_path(info) for info in self.swap_params_info.values() if info.swapped_gradients}

    @contextlib.contextmanager
    def loading_checkpoint(self, places: "LoadPlaces" = None, before_copy=None):
        """While the engine's load_checkpoint runs (install.py wraps it): its read of ``swap_folder`` is a load's,
        and its copy of the checkpoint's files over the folder places what ``places`` says (``load_target_name``),
        or what ``before_copy(places, source)`` returns when the copy starts (``begin_load_copy``: by then the
        engine has read the checkpoint's own description, e.g. how many ranks saved it)."""
        self._checkpoint_load_pending = True
        try:
            self._give_back_reads_ahead_before_load()
            self.forget_master_copies()  # (what the partitions owe the files is written first: before they go)
            self._load_places = places or LoadPlaces.ALL
            self._before_load_copy = before_copy
            self.last_load_places = self.last_load_source = None
            if self._load_places is LoadPlaces.ALL:  # the optimizer's state is loaded: a sub-group whose state was
                self._start_lost_sub_groups_over()  # lost starts as a fresh engine's, given the checkpoint's (helper-232)
            yield
            if self.last_load_places in (LoadPlaces.ALL, LoadPlaces.STATE_WRITTEN):  # the optimizer's state loaded
                self._lost_states, self._lost_groups = {}, {}  # replaces what was lost, and a half-updated one
                self.update_stopped_part_way = 0
        finally:
            self._checkpoint_load_pending = False
            self._load_places = LoadPlaces.ALL
            self._before_load_copy = None

    def _give_back_reads_ahead_before_load(self) -> None:
        """Reads a backward started ahead for an update that never came (a step skipped on overflow, a load in the
        middle of gradient accumulation) are of the files the load replaces, and the swap-ins after its copy would
        be served them: given back first, then dropped with every copy held (_drop_copies_held_before_load). With the
        optimizer on NVMe stage 3's purge_state, which gives them back too, is not called on a load. One that failed
        (its file missing, say) read a file the load replaces: said, not raised."""
        try:
            self.ahead.release_all()
        except Exception as err:  # noqa: BLE001  (the load replaces the file that read failed on)
            logger.warning("tencache: a read started ahead before a checkpoint load failed (%s); the load replaces "
                           "its file", err)

    def begin_load_copy(self, source: str) -> None:
        """The engine's copy of a checkpoint's folder ``source`` over the swap folder starts (checkpoint_save.py):
        settle what it places, and remember both for what follows the load (``last_load_source``,
        ``last_load_places``: adoption). Files an earlier load left staged (it stopped before adoption) go."""
        loaded_ids = set()

        def look():
            self.drop_staged_loads()
            names = os.listdir(source) if os.path.isdir(source) else ()
            loaded_ids.update(match["id"] for name in names
                              for match in [SWAP_FILE_NAME.match(name)] if match is not None)
            self._stage_own_files = self._room_to_stage(source, [
                name for name in names for match in [SWAP_FILE_NAME.match(name)]
                if match is not None and match["id"] in self.swap_params_info])

        if self._before_load_copy is None:
            look()
        else:  # the engine's load, whose agreements over the ranks follow: one rank's error stops every rank
            raised_on_every_rank(look, lambda: TencacheError(
                f"load_checkpoint: another rank could not read its checkpoint folder or tidy its swap folder (its "
                f"error says why); the load stops on every rank. {LOAD_REFUSED}"))
        self.last_load_source = source
        # Where the checkpoint's sub-group ids are not this engine's, adoption renames its files to them afterwards
        # (checkpoint.adopt_loaded_files): every file is placed hidden until then. One under its own name, where the
        # two sets of ids overlap, replaced this engine's live file of that id, which the engine's reset right after
        # the copy then read as this engine's sub-group and wrote back changed (its write possibly still in flight
        # when adoption renamed the file away): the loaded bytes adopted were those (helper-143's review).
        self._stage_every_loaded_file = not set(self.swap_params_info) <= loaded_ids
        if self._before_load_copy is not None:
            self._load_places = self._before_load_copy(self._load_places, source)
        self.last_load_places = self._load_places

    def _room_to_stage(self, source: str, names) -> bool:
        """Can the copy place this engine's own files ``names`` of ``source`` hidden beside the live ones until all
        are placed (``name_after_load_copy``)? Linked (one file system) they take no room; copied, as much again as
        they hold, on every rank of the node at once (helper-158's review: a load that fitted stopped on no room). Where
        not, each replaces its live file as it is placed (as stock's copy does), said in the log."""
        if not names or not os.path.isdir(self._folder) or _links_into(os.path.join(source, names[0]), self._folder):
            return True
        needed = sum(os.path.getsize(os.path.join(source, name)) for name in names) * local_world_size()
        free = shutil.disk_usage(self._folder).free
        if free >= needed:
            return True
        logger.info("load: %s free in %s, %s to copy: each swap file replaces its live one as it is copied (a copy "
                    "stopped part way leaves some live files the checkpoint's)", fmt_bytes(free), self._folder,
                    fmt_bytes(needed))
        return False

    def drop_staged_loads(self) -> None:
        """Delete the checkpoint's files a load placed hidden (``staged_load_name``) that adoption did not take."""
        for name in os.listdir(self._folder) if os.path.isdir(self._folder) else ():  # (removed by its user)
            if is_staged_load(name):
                os.unlink(os.path.join(self._folder, name))

    def owns_file(self, name: str) -> bool:
        """Whether the swap file ``name`` in the folder is this swapper's. Engines alive at once from one config
        share the folder (``optimizer/rank<N>`` under one ``nvme_path``; stock's too), each with its own sub-group
        ids: a checkpoint of one engine takes its own files only (its load would put the other's back over their
        live ones), and closing one engine leaves the other's files alone. A name that is no swap file's is owned
        (stock's save copies whatever the folder holds)."""
        match = SWAP_FILE_NAME.match(name)
        return match is None or match["id"] in self.swap_params_info

    def load_target_name(self, name: str) -> Optional[str]:
        """The name under which the engine's copy of a checkpoint over the swap folder (checkpoint_save.py) places
        the checkpoint's file ``name``, or None where it places nothing (LoadPlaces). Every swap file is placed
        hidden, ``staged_load_name``; once the copy is done, those of this engine's sub-groups take their own names
        (``name_after_load_copy``). A swap file of a sub-group this swapper does not have (a checkpoint from a rebuilt
        model or another process), and every one where adoption will rename them (``begin_load_copy``), stays hidden
        for adoption to rename (checkpoint.adopt_loaded_files): under its own name it could replace the live file of
        another engine sharing the folder, whose sub-group ids may be the checkpoint's."""
        if not self._load_places.places_files:
            return None
        match = SWAP_FILE_NAME.match(name)
        if match is not None and (self._stage_own_files or self._stage_every_loaded_file or
                                  match["id"] not in self.swap_params_info):
            return staged_load_name(name)  # hidden while the copy runs: see name_after_load_copy
        return name

    def name_after_load_copy(self, name: str) -> Optional[str]:
        """The name the checkpoint's swap file ``name``, placed hidden by the copy (``load_target_name``), takes once
        the whole copy is done: its own, where it is one of this engine's sub-groups and no adoption renames the
        files; else None (it stays hidden: adopted, or dropped). A copy that stops part way (no room, a drive's
        error, Ctrl-C) so leaves the live files whole, not some replaced by the checkpoint's and the rest not
        (helper-155's review)."""
        match = SWAP_FILE_NAME.match(name)
        if match is None or not self._stage_own_files or self._stage_every_loaded_file or \
                match["id"] not in self.swap_params_info:
            return None
        return name

    def _drop_copies_held_before_load(self) -> None:
        """Forget every copy held (all flushed at the load's read of ``swap_folder``): the next use reads the file
        the checkpoint put there, narrowed first where it is a state in stock's widened layout."""
        self._drop_held_copies = False
        self.forget_master_copies()
        # but gradients: the load places no gradient file, and one held only here (never written: the flush leaves
        # gradients) was forgotten, its file missing at the rebuild's swap-in (helper-209; stock's gradient files
        # survive its copy too)
        gradients = self._gradient_keys()
        for key in self.store.held_keys():
            if key not in gradients:
                self.store.forget(key)
        self.narrow_loaded_states()

    def narrow_loaded_states(self) -> None:
        """Files of states kept in another dtype than the masters' that a load placed in stock's widened layout (a
        checkpoint of stock's NVMe offload) are narrowed to this swapper's (cache/state_dtype.py): after the load's
        copy, and after files are adopted under this engine's ids (checkpoint.py)."""
        for path, dtype in self._state_dtypes.items():
            numel = self.swap_params_info[SWAP_FILE_NAME.match(os.path.basename(path))["id"]].numel()
            if narrow_stock_layout(path, numel, dtype, self.dtype,
                                   self.store.entries.swap_nbytes(self._stored_numel(path, numel)),
                                   self.store.entries.swap_nbytes(numel)):
                self.store.forget(path)  # the file was replaced: no copy of the old one is used

    def _create_param_swap_info(self, parameter, numel):
        # The base class passes self.swap_folder, which would flush: use the folder directly.
        param_id = OptimizerSwapper.parameter_id(parameter)
        assert param_id not in self.swap_params_info, f"sub-group {param_id} is registered twice"
        swap_info = OptimizerStateSwapInfo(parameter=parameter, numel=numel, base_folder=self._folder,
                                           aio_handle=_PoolView(self.pool))
        self.swap_params_info[param_id] = swap_info
        self._update_param_state_info(swap_info, parameter)
        return swap_info

    # ------------------------------------------------------------------------------------- initialisation
    def initialize_parameters(self, parameters, src_tensors):
        self.forget_master_copies()
        paths = self._get_swap_paths(parameters=parameters, num_elems=[src.numel() for src in src_tensors])
        for path, source in zip(paths, src_tensors):
            self._store_new(path, source, widen=True)

    def initialize_from_swapped_fp16_params(self, fp16_partitions_info, fp16_num_elems, fp16_pinned_buffers,
                                            fp32_parameters):
        """offload_optimizer.fast_init: build each fp32 master straight from the fp16 partitions (in memory or in
        the param swapper's files) without the lent staging buffers stock needs."""
        self.forget_master_copies()
        paths = self._get_swap_paths(parameters=fp32_parameters, num_elems=fp16_num_elems)
        for partitions, numel, path in zip(fp16_partitions_info, fp16_num_elems, paths):
            with self._new_bytes(path, numel) as master:
                offset = 0
                for tensor, partition_numel, partition_path in partitions:
                    destination = master.narrow(0, offset, partition_numel)
                    if partition_path is None:
                        destination.copy_(tensor.data)
                    else:
                        low = torch.empty(partition_numel, dtype=param_swapper.dtype_of_swap_file(partition_path))
                        self.io.read(low, partition_path).result()  # a partition's file missing raises here
                        destination.copy_(low)
                    offset += partition_numel

    # ------------------------------------------------------------------------------------ swap in and out
    def swap_in_optimizer_state(self, parameter, async_parameter=None):
        # async_parameter defaults to None: the Muon path calls without it (stock Pipelined has no default).
        if self._drop_held_copies:
            self._drop_copies_held_before_load()
        swap_info = self._get_param_swap_info(parameter)
        if swap_info is None:
            return
        group = OptimizerSwapper.parameter_id(parameter)
        if group in self._lent:
            # A fragment call inside one that holds this sub-group: a vectorised update's function reading a
            # gradient of its own sub-group. Lending it again would replace what the outer call holds, and stage 3
            # sets the sub-group's gradient to None at the inner release under the outer's feet (stock NVMe stops
            # there); refused before anything changes, so the outer call gives its sub-group back as it is.
            raise RuntimeError(
                f"optimizer sub-group {group} is already swapped in: with the optimizer on NVMe a sub-group is "
                "swapped in once at a time. A fragment call (safe_get_full_grad, safe_get_full_fp32_param, ...) for "
                "a parameter of the sub-group safe_update_full_grad_vectorized is updating, made from inside its "
                "update function, is not supported: read what it needs before or after the update. (After an "
                "optimizer step that stopped part way, its sub-group stays swapped in until engine.destroy().)")
        if group in self._lost_groups:  # before anything is lent
            self._refuse_lost_state(self._lost_groups[group])
        read_ahead = self.ahead.take(group)
        try:  # (the reads taken are no longer ReadsAhead's: whatever stops here gives them back)
            master_path = swap_info.tensors[0].swap_path
            from_partitions = self._master_in_partitions(group, master_path) and master_path not in read_ahead
            # a master read ahead while its file was behind the partitions was read from them (_owed_master_fill):
            # its lend takes the debt over as a fill does
            read_from_partitions = from_partitions or (master_path in read_ahead and self.masters.owed(group))
            self.masters.before_lend(group, read_from_partitions)  # (a failed write of one behind is raised here)
        except BaseException:
            self._give_back_unlent(read_ahead, ())
            raise
        try:
            self.masters.lent(group)
            if from_partitions:
                numel = self._stored_numel(master_path, swap_info.numel())
                self.store.add(master_path, numel, master_path)
                master = self.store.lend_copied(master_path, functools.partial(self.masters.fill, group))
        except BaseException:
            self.masters.owed_again_unlent(group, master_path)
            self._give_back_unlent(read_ahead, ())
            raise
        # filled as each is lent (the master lent above first): a failed read still gives the others back, and a
        # master lent with its file's debt stays recorded as lent (a save refuses it; close owes it again)
        keys = self._lent[group] = [master_path] if from_partitions else []
        if self._getter_swap_ins is not None:  # (before the reads: one that fails leaves the others lent)
            self._getter_swap_ins.append(parameter)
        try:
            self._read_next_if_free(swap_info, async_parameter, read_ahead, from_partitions)
            for index, context in enumerate(swap_info.tensors):
                path = context.swap_path
                numel = self._stored_numel(path, swap_info.numel())
                if index == 0 and from_partitions:  # the first is the master, lent above
                    buffer = master
                else:
                    buffer = self._lend(path, numel, read_ahead)
                    keys.append(path)
                view = self._as_state(path, buffer, swap_info.numel())
                context.compute_tensor.data = view.data
                context.swap_tensor.data = view.data
            # a fragment call that reads only the masters or the state (safe_get_full_fp32_param and the like) is
            # not lent the gradient: a fill of the whole sub-group's, or its read, for nothing
            lends_gradient = self._getter_swap_ins is None or self._fragment_reads_gradient
            if swap_info.has_gradients() and not lends_gradient:
                self.fragment_swap_ins_without_gradient += 1
                # a gradient read ahead for this sub-group by an update that stopped before it (only an update reads
                # a gradient ahead): taken from ReadsAhead above, so given back here or left reading for good
                if gradient_path(swap_info) in read_ahead:
                    self.store.release(gradient_path(swap_info))
            elif swap_info.has_gradients():
                path = gradient_path(swap_info)
                parameter.grad = self.gradients.lend(group, path, swap_info.numel(),
                                                     functools.partial(self._lend, path, swap_info.numel(), read_ahead))
                keys.append(path)
            elif (self._in_stage3_step() and self._getter_swap_ins is None) or \
                    (self._getter_swap_ins is not None and self._fragment_reads_gradient):
                # no micro-batch has reduced into this sub-group yet (a head, a branch or an expert unused so far;
                # any sub-group before the first backward): stock CPU offload steps it, and its fragment calls read
                # and write it, in its gradient buffer's zeros; with none, stage 3's unscale stopped the first step
                # and its gradient getters and setters stopped at once (AttributeError on None; stock NVMe too:
                # helper-190's and helper-240's reviews). Its memory goes with the step or the call (stage 3 drops
                # the gradient at the sub-group's swap-out or release; a setter's values are stored at its
                # write-back). Not in the swap-ins of start-up and of a load's rebuild: they take no gradient
                # (helper-191).
                parameter.grad = torch.zeros(swap_info.numel(), dtype=parameter.dtype, device=parameter.device)
        except BaseException:
            self._give_back_unlent(read_ahead, keys)
            if master_path not in keys:  # its read (ahead, from the partitions) failed: they still hold it, owed
                self.masters.owed_again_unlent(group, master_path)
            raise
        if async_parameter is not None and self.reads_ahead:
            next_info = self._get_param_swap_info(async_parameter)
            if next_info is not None and OptimizerSwapper.parameter_id(async_parameter) not in self._lent:
                self.ahead.next_sub_group(next_info)

    def _read_next_if_free(self, swap_info, async_parameter, read_ahead, master_lent: bool) -> None:
        """Before this swap-in waits for its sub-group's reads: the next sub-group's reads, into the streaming slots
        this one will not need (cache/optimizer_reads_ahead.py ``next_sub_group_if_free``)."""
        if async_parameter is None or not self.reads_ahead:
            return
        next_info = self._get_param_swap_info(async_parameter)
        if next_info is None or OptimizerSwapper.parameter_id(async_parameter) in self._lent:
            return
        spare = self.store.idle_streaming_slots() - self._buffers_still_needed(swap_info, read_ahead, master_lent)
        self.ahead.next_sub_group_if_free(next_info, spare)

    def _buffers_still_needed(self, swap_info, read_ahead, master_lent: bool) -> int:
        """Buffers the swap-in of ``swap_info`` has still to take: one for each of its tensors on file not read
        ahead (the master unless ``master_lent``), and one for its gradient unless the tier holds it."""
        paths = [context.swap_path for context in swap_info.tensors][1 if master_lent else 0:]
        if swap_info.has_gradients():
            paths.append(gradient_path(swap_info))
        return sum(1 for path in paths if path not in read_ahead and
                   not (self.store.knows(path) and self.store.state(path) in CACHED))

    def swap_out_optimizer_state(self, parameter, async_swap=False):
        # The step changed the master and state tensors in place; new state tensors (Adam's moments on its first
        # step) are the optimizer's own allocations and are stored once. The step also scaled the gradient in
        # place, but it is dead now: a held copy keeps the scaled bytes (they are what DeepSpeed last saw), a
        # transient one is not written again (the file keeps the fragments as stored, as stock's does).
        swap_info = self.swap_params_info.get(OptimizerSwapper.parameter_id(parameter))
        gradient_held = swap_info is not None and swap_info.has_gradients() and \
            self.store.kept(gradient_path(swap_info))
        if self._in_stage3_step():  # (updated before this, whatever its give-back does)
            self._updated_in_step += 1
        self._give_back(parameter, states_changed=True, gradient_changed=gradient_held)
        if not self.writes_behind and swap_info is not None:
            for context in swap_info.tensors:  # pipeline_write false: the update's writes end with it
                self.store.flush_key(context.swap_path)

    def release_swap_buffers(self, parameter):
        if self._deferred is not None:
            self._deferred.append(parameter)
            return
        self._give_back(parameter, states_changed=False, gradient_changed=False)

    @contextlib.contextmanager
    def releases_deferred(self, gradients_written: bool = False, reads_gradient: bool = True):
        """Inside, a sub-group swapped in and released unchanged stays lent until the end. Stage 3's fragment
        getters release the sub-group before they read what they return (``get_full_hp_param`` gathers from its
        view after the release; the local getters return the view itself): its buffer is a streaming slot, or a
        held one, that the next read or eviction gives another tensor (install.py wraps them). A sub-group swapped
        in inside and neither released nor swapped out by the end (a getter or setter that raised) is given back
        unchanged then; with ``gradients_written`` (a call that writes its sub-group's gradient fragment by
        fragment, ``update_fp32_grad_for_param_vectorized``) its gradient, where lent, is given back changed: the
        fragments written before the call raised are kept, as stock CPU offload keeps them. Without
        ``reads_gradient`` (a call that reads or writes only the masters or the state) a sub-group swapped in
        inside is lent without its gradient."""
        outer, self._deferred = self._deferred, []
        outer_swap_ins, self._getter_swap_ins = self._getter_swap_ins, []
        outer_reads_gradient, self._fragment_reads_gradient = self._fragment_reads_gradient, reads_gradient
        raised = False
        try:
            yield
        except BaseException:
            raised = True
            raise
        finally:
            deferred, self._deferred = self._deferred, outer
            swapped_in, self._getter_swap_ins = self._getter_swap_ins, outer_swap_ins
            self._fragment_reads_gradient = outer_reads_gradient
            # A getter (or setter) that raised between its swap-in and its release (or swap-out) gave nothing back:
            # stage 3 reads optimizer.state[master][key] in between, and generic code asks for a key the optimizer
            # may not have (SGD's "momentum_buffer", then Adam's "exp_avg"). Its sub-group goes back unchanged here;
            # left lent, the next swap-in of it stopped on "already lent" (stock NVMe's leaks its buffers and stops
            # on an empty buffer list; stock CPU offload trains on).
            released = {id(parameter) for parameter in deferred}
            left = {id(parameter): parameter for parameter in swapped_in
                    if id(parameter) not in released and OptimizerSwapper.parameter_id(parameter) in self._lent}
            error = None
            for parameter, left_lent in [(p, False) for p in deferred] + [(p, True) for p in left.values()]:
                try:  # each goes back whatever another's give-back raised
                    if left_lent and gradients_written and self._gradient_lent(parameter):
                        self.writeback_optimizer_state_and_gradients(parameter, False, True)
                    else:
                        self.release_swap_buffers(parameter)
                except Exception as err:  # noqa: BLE001  (raised once all went back)
                    error = error or err
                finally:
                    if left_lent:  # as stage 3's own release does: the lent gradient's buffer went back
                        parameter.grad = None
            if error is not None:
                if not raised:
                    raise error
                # the call's own error is the one its caller catches (KeyError)
                logger.error("giving back the sub-groups a fragment call swapped in failed too", exc_info=error)

    def _in_stage3_step(self) -> bool:
        """Within stage 3's step() (install.py marks its optimizer)."""
        stage3 = self._stage3() if self._stage3 is not None else None
        return stage3 is not None and getattr(stage3, IN_STEP_ATTRIBUTE, False)

    def _gradient_lent(self, parameter) -> bool:
        """Whether ``parameter``'s sub-group has its gradient lent now (a getter lends it with the states), or the
        zeros of one with no gradient yet (``swap_in_optimizer_state``: a vectorised update before the first backward
        that raised part way wrote some of them; helper-242's review)."""
        group = OptimizerSwapper.parameter_id(parameter)
        swap_info = self.swap_params_info.get(group)
        if swap_info is None or group not in self._lent:
            return False
        if not swap_info.has_gradients():
            return parameter.grad is not None
        return gradient_path(swap_info) in self._lent[group]

    def writeback_optimizer_state_and_gradients(self, parameter, write_opt_state, write_gradients):
        # A gradient set through DeepSpeed's API (set_full_fp32_grad): its newest bytes are the lent buffer's,
        # kept or written as any changed entry; fragments still in DeepSpeed's buffer are older.
        if write_gradients:
            group = OptimizerSwapper.parameter_id(parameter)
            swap_info = self.swap_params_info.get(group)
            if swap_info is not None and not swap_info.has_gradients() and parameter.grad is not None:
                # the zeros a step or a setter lent a sub-group with no gradient yet, written (Muon's pass, a
                # gradient set before the first backward): its first gradient, stored as a new one (given back with
                # the states, the written values were dropped: helper-191)
                swap_info.get_or_create_gradient_paths([0], [swap_info.numel()])
                self._store_new(gradient_path(swap_info), parameter.grad)
            self.gradients.written_back(group)
        self._give_back(parameter, states_changed=write_opt_state, gradient_changed=write_gradients)

    def swap_out_gradients(self, parameter, gradient_offsets, gradient_tensors):
        """Keep the sub-group's fp32 gradient fragments as stock does: each at its offset of the sub-group's
        gradient, the bytes between them left as they were. Stage 3 calls this once per reduce bucket (at one rank on a
        host accelerator once per gradient: one_rank_reduce.py), so a sub-group gets its fragments in several calls.

        A fragment whose values stage 3 keeps in its host gradient buffer until the update (stage3_gradients.py:
        when and why) is not copied: that view of the buffer is remembered and the update reads it from there
        (optimizer_gradients.py), so gradients make no NVMe round trip and take no host memory of the tier's.

        A fragment without such a copy is stored: held in host memory, copied into the held buffer, which reaches
        the file only if evicted; on file, written to its offset in the file (nothing read back); the first
        gradient of a sub-group is a new entry, zeros between the fragments (stock's new file is sparse). The store
        does all three (EntryStore.write_parts)."""
        group = OptimizerSwapper.parameter_id(parameter)
        swap_info = self.swap_params_info.get(group)
        if swap_info is None:
            return
        if not swap_info.swapped_gradients:
            swap_info.get_or_create_gradient_paths([0], [swap_info.numel()])
        self.gradients.handed(group, swap_info, gradient_offsets, gradient_tensors)

    def reads_stage3_copy(self, parameter, offset: int, fragment) -> bool:
        """Would ``swap_out_gradients`` remember stage 3's host copy of ``fragment`` (handed for the sub-group of
        ``parameter`` at ``offset``) rather than store it? Then stage 3 need not cast it first
        (stage3_gradients.handing_gradients_uncast)."""
        return self.gradients.reads_stage3_copy(OptimizerSwapper.parameter_id(parameter), offset, fragment)

    def gradient_scaled(self, parameter, factor) -> None:
        """Stage 3 multiplied the lent gradient of ``parameter``'s sub-group in place by ``factor``
        (stage3_gradients.noting_gradient_scales)."""
        group = OptimizerSwapper.parameter_id(parameter)
        swap_info = self.swap_params_info.get(group)
        if swap_info is not None and swap_info.has_gradients():
            self.gradients.scaled(group, factor, gradient_path(swap_info))

    def flush_gradients(self):
        pass  # nothing is staged: swap_out_gradients stores into the entries directly

    def forget_state_tensors(self, parameter) -> int:
        """A load of a checkpoint that holds no optimizer state for ``parameter``'s sub-group (saved before its first
        step): Adam starts over there, as torch's ``load_state_dict`` of that state does (stock CPU offload), so its
        state tensors are no longer registered or held (the live ones were this engine's, not the checkpoint's); the
        next step creates them anew. Returns how many were forgotten."""
        swap_info = self._get_param_swap_info(parameter)
        if swap_info is None or not swap_info.has_state_tensors:
            return 0
        if OptimizerSwapper.parameter_id(parameter) in self._lent:
            raise RuntimeError(f"optimizer sub-group {OptimizerSwapper.parameter_id(parameter)} is swapped in: its "
                               "state cannot be forgotten by a checkpoint load")
        states = swap_info.tensors[1:]
        for context in states:
            if self.store.knows(context.swap_path):
                self.store.forget(context.swap_path)
            # its file goes too: a save before the next step (which writes it anew) linked it into the checkpoint,
            # whose ZeRO file says the state is empty (the checkpoint's room taken for nothing)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(context.swap_path)
        swap_info.tensors = swap_info.tensors[:1]
        swap_info.has_state_tensors = False
        return len(states)

    def purge_state(self):
        """Checkpoint load: DeepSpeed forgets the state-tensor registrations and will copy the checkpoint's files
        over the folder; the tier writes what it owes first (a load without optimizer files then still finds every
        file current) and forgets every entry, so nothing from before the load is served. Gradients do not survive
        a load (stock's checkpoints skip them too)."""
        super().purge_state()
        self.forget_master_copies()  # (settled first)
        self.gradients.forget_all()
        self.ahead.release_all()
        self.store.flush()
        self.store.forget_all()
        for swap_info in self.swap_params_info.values():
            swap_info.swapped_gradients = {}
            swap_info.unswapped_gradients = {}

    def close(self):
        """Write what the tier owes to the files, then give back buffers, the streaming arena and I/O threads."""
        if self.closed:
            return
        try:
            # a swap-in or update that failed (a missing file, say) left its sub-group lent: given back unchanged,
            # so that the error the run stopped on is the one the user sees, not "cannot forget tensor ... lent" (a
            # master lent with its file's debt owes it again from the partitions, as it was before that update:
            # not the lent buffer, which Adam may have stepped part of)
            failures = []

            def attempt(step, *args):
                """Each step of closing runs whatever the ones before raised: an error (the missing file a read
                ahead met, a failed write) is raised once the buffers, arena and I/O threads are given back."""
                try:
                    step(*args)
                except Exception as err:  # noqa: BLE001  (the first is raised at the end)
                    failures.append(err)

            for group, keys in self._lent.items():
                info = self.swap_params_info[group]
                attempt(self.masters.owed_again_unlent, group, info.tensors[0].swap_path)
                attempt(self._return_lent, info, set(keys), False, False, False)
            self._lent = {}
            attempt(self.ahead.release_all)
            if getattr(self, "masters", None) is not None:
                attempt(self.masters.close)
            attempt(self.store.flush)
            attempt(self.store.close)  # its buffers, then the streaming slots' arena
            # its files still shared with a checkpoint: no later writer may reach it (another engine's stay: owns_file)
            attempt(unshare_folder, self._folder, self.owns_file)
            # a checkpoint's files a load that stopped left hidden: no later run wants them
            attempt(self.drop_staged_loads)
            attempt(self.io.close)
            if failures:
                raise failures[0]
        finally:
            folder_lock.let_go(self._folder_key)
            self.closed = True
            if getattr(self, "_unshare_at_exit", None) is not None:  # (None: closed before its set-up ended)
                self._unshare_at_exit.detach()

    # ---------------------------------------------------------------------------------- memory pressure
    def host_footprint_bytes(self) -> int:
        """Host memory the tier holds for optimizer state now (cache/optimizer_store.py)."""
        return self.store.host_footprint_bytes()

    def least_host_footprint_bytes(self) -> int:
        return self.store.least_host_footprint_bytes(self._reads_two_sub_groups(), self._writes_while_stepping())

    def resize_host_footprint(self, target_bytes: int) -> None:
        """Hold about ``target_bytes`` of host memory for optimizer state from now on (memory pressure, or memory
        back: integrations/deepspeed/memory_pressure.py)."""
        self.store.resize_host_footprint(target_bytes, self.state_bytes(), self._reads_two_sub_groups(),
                                         self._update_slots(), self._writes_while_stepping())

    def planned_host_footprint_bytes(self) -> int:
        return self.store.planned_host_footprint_bytes(self.state_bytes(), self._reads_two_sub_groups(),
                                                       self._update_slots(), self._writes_while_stepping())

    def footprint_keeping_everything_bytes(self) -> int:
        """The footprint at which the tier keeps every sub-group: the state, and the slot an update still lends."""
        return self.state_bytes() + self._update_slots() * self.store.streaming_slot_bytes

    def _update_slots(self) -> int:
        """Streaming slots an update lends even when the tier keeps everything (optimizer_gradients.py)."""
        return self.gradients.update_slots(len(self.swap_params_info))

    def state_bytes(self) -> int:
        """Every sub-group's master and optimizer state as DeepSpeed registered it (Adam's two moments, Adagrad's
        one, Muon's bf16 momentum in its own bytes), and the gradients the tier can hold, in the buffers keeping
        them takes (cache/optimizer_store.py)."""
        numels = []
        for group, info in self.swap_params_info.items():
            gradient = [info.numel()] if self.gradients.held_by_store(group) else []
            numels += [info.numel(), *self._state_numels(info), *gradient]
        return self.store.state_bytes(numels)

    def _state_numels(self, swap_info) -> list:
        """The store's elements each state tensor of a sub-group takes: those DeepSpeed registered for swapping;
        none where its state exists and none of it is swapped (DeepSpeed keeps it in memory: Muon's
        ``save_muon_momentum_buffer_in_memory``, or a state too small to swap); Adam's two moments where the
        optimizer has not made it yet (DeepSpeed's CPU optimizers make theirs at their first step), or where
        DeepSpeed forgot the registrations at a checkpoint load (``purge_state``: empty placeholders until the next
        swap registers them again)."""
        if swap_info.has_state_tensors:
            return [self._stored_numel(context.swap_path, swap_info.numel()) for context in swap_info.tensors[1:]]
        state = self.optimizer.state.get(swap_info.tensors[0].compute_tensor, {})  # the master is its key
        if any(torch.is_tensor(value) and value.dim() > 0 and value.numel() > 0 for value in state.values()):
            return []
        return [swap_info.numel()] * UNREGISTERED_STATES

    def _reads_two_sub_groups(self) -> bool:
        """An update holds two sub-groups at once: the one stepping, and the next one read ahead meanwhile."""
        return self.reads_ahead and len(self.swap_params_info) > 1

    def _writes_while_stepping(self) -> bool:
        """The last sub-group's changed tensors keep their slots while the next one steps: written behind, with
        another sub-group to step (one sub-group's writes end long before its next update)."""
        return self.writes_behind and len(self.swap_params_info) > 1

    # ------------------------------------------------------------------ step boundaries: logging, metrics
    def pre_backward(self):
        super().pre_backward()
        self._backwards_this_step += 1
        if self.reads_ahead:
            if self._drop_held_copies:  # a checkpoint was loaded: drop the copies held before first
                self._drop_copies_held_before_load()
            self.ahead.during_backward(self._sub_groups_in_update_order(), self._lent,
                                       last_backward=self._backwards_this_step >= self._micro_steps)

    def _sub_groups_in_update_order(self) -> list:
        """The sub-groups' swap info in the order stage 3's update steps them: its fp32 partitions' order. The
        order they were registered in differs where stage 3 keeps some 16-bit partitions in memory
        (offload_param.max_in_cpu, 1e9 by default, below the model's size): the sub-groups without a flat partition
        in memory register as they are built, the others after them. The backward then read ahead a sub-group from
        the middle of the update for its first, which it held until the update came to it."""
        stage3 = self._stage3() if self._stage3 is not None else None
        flats = getattr(stage3, "fp32_partitioned_groups_flat", None) or []
        ordered = [self.swap_params_info[flat.ds_id] for flat in flats
                   if getattr(flat, "ds_id", None) in self.swap_params_info]
        return ordered if len(ordered) == len(self.swap_params_info) else list(self.swap_params_info.values())

    def gradient_reduced(self) -> None:
        """Stage 3 reduced a gradient in the backward (install.py): reads ahead that waited for the last update's
        writes behind start once those are done."""
        if self.reads_ahead and not self.closed:
            self.ahead.after_writes()

    def log_timers(self):
        # DeepSpeed calls this at the end of every optimizer step (stage3 _post_step), and once after building
        # the optimizer states, before the first backward: that one is not a training step.
        super().log_timers()
        if not self._profile_looked_up:  # the first call ends initialisation: every sub-group is known
            self._profile_looked_up = True
            # keyed by file name, not path: the same run in another nvme_path has the same profile
            tensors = sorted((os.path.basename(key), numel) for key, numel in self.store.numels())
            # one pass over the sub-groups per step whatever gradient accumulation or checkpointing do
            self.store.next_use = self.profile.load(tensors, dtype=str(self.dtype), world_size=dist.get_world_size())
        self.store.next_use = self.profile.end_step()
        self.gradients.end_window()
        if self._backwards_this_step:  # the window the caller's boundaries make (unmanaged accumulation too)
            self._micro_steps = self._backwards_this_step
        self._backwards_this_step = 0

    # --------------------------------------------------------------------------------------------- stats
    def stats(self) -> dict:
        counters = self.io.counters()
        stats = {f"optimizer_{key}": value for key, value in self.pool.stats().items()}
        stats["optimizer_profile"] = self.profile.source
        stats["optimizer_profile_divergences"] = self.profile.divergences
        stats["optimizer_swapper_closed"] = int(self.closed)
        stats["optimizer_backward_reads_ahead"] = self.ahead.in_backward
        stats["optimizer_reads_ahead_after_writes"] = self.ahead.after_their_writes
        stats["optimizer_reads_ahead_before_own_waits"] = self.ahead.before_own_waits
        stats["optimizer_fragment_swap_ins_without_gradient"] = self.fragment_swap_ins_without_gradient
        # the masters filled from the parameter partitions: the only reads the store serves by a copy
        stats["optimizer_masters_from_partitions"] = self.store.counters.copied
        stats["optimizer_master_bytes_from_partitions"] = self.store.counters.copied_bytes
        stats.update(self.masters.stats())  # ... written from them where needed, and owed to the files now
        stats.update({f"optimizer_cache_{key}": value for key, value in self.store.stats().items()})
        stats.update(self.gradients.stats())
        stats.update(optimizer_cache_budget_bytes=self.budget.total_bytes,
                     optimizer_least_footprint_bytes=self.least_host_footprint_bytes(),
                     optimizer_nvme_read_bytes=counters.read_bytes, optimizer_nvme_write_bytes=counters.write_bytes,
                     stock_optimizer_pinned_bytes_estimate=self.stock_pinned_bytes_estimate())
        stats.update({f"optimizer_checkpoint_{key}": value
                      for key, value in dataclasses.asdict(self.checkpoint_totals).items()})
        return stats

    def stock_pinned_bytes_estimate(self) -> int:
        """SwapBufferManager's lock: buffer_count buffers of the largest sub-group (optimizer_utils.py)."""
        return int(self.swap_config.buffer_count) * self.largest_numel * self.swap_element_size

    # ------------------------------------------------------------------------------------------- private
    def _give_back_unlent(self, read_ahead, lent) -> None:
        """A swap-in stopped: the reads started ahead for its sub-group that were not lent yet are no longer
        ReadsAhead's (taken) nor in _lent. Given back here, or they stay READING, and a later swap-in of the
        sub-group stops on "already lent or being read" instead of the error that stopped this one."""
        for path in read_ahead:
            if path not in lent:
                with contextlib.suppress(Exception):  # (the same failure, most likely: the swap-in's is raised)
                    self.store.release(path)

    def _lend(self, path, numel, read_ahead):
        if path in read_ahead:
            return self.store.wait_read(path)
        self.store.add(path, numel, path)  # after a checkpoint load the entry is new and its file current
        return self.store.lend(path)

    def _store_new(self, path, source, widen: bool = False):
        """A new entry at ``path`` with ``source``'s values: a master widened from its 16-bit partition
        (``widen``), or the bytes of a state the optimizer created, which are never cast."""
        registered = self._state_dtypes.get(path, self.dtype)
        if registered != source.dtype and not widen:
            raise RuntimeError(f"optimizer state {os.path.basename(path)} is {source.dtype}, registered as "
                               f"{registered}")
        with self._new_bytes(path, self._stored_numel(path, source.numel())) as buffer:
            self._as_state(path, buffer, source.numel()).copy_(source.data.reshape(-1))

    @contextlib.contextmanager
    def _new_bytes(self, path, numel):
        """A buffer for ``path``'s first bytes, released changed once the body filled it. A fill that raises (a
        parameter partition's file missing under fast_init, a copy of another size) gives it back unwritten and
        forgets the entry, whose file owes nothing yet (every caller's entry is new: built at init, or a state the
        optimizer just created); left lent, it stopped every flush and the swapper's close on "lent and changed"."""
        buffer = self.store.lend_new(path, numel, path)
        try:
            yield buffer
        except BaseException:
            self.store.discard(path)
            raise
        self.store.release(path, changed=True)

    # ------------------------------------------------------------------------- state in another dtype
    def _update_param_state_info(self, swap_info, parameter):
        """DeepSpeed registers a sub-group's state tensors once, while they are the optimizer's own tensors (or a
        loaded checkpoint's placeholders of their dtype); its ``release_memory`` later empties them to fp32. A
        state narrower than the masters is noted here, and the store keeps its own bytes (cache/state_dtype.py):
        Muon's momentum is in the communication dtype, bf16 beside fp32 masters. Stock NVMe widens it to fp32 on
        file (twice the bytes; its files are narrowed when a load places them: ``narrow_loaded_states``); keeping it
        in host memory instead is DeepSpeed's ``save_muon_momentum_buffer_in_memory``, the user's choice. A wider
        state is refused: the tier sizes its buffers and slots in the masters' dtype."""
        registered = swap_info.has_state_tensors
        super()._update_param_state_info(swap_info, parameter)
        if registered:
            return
        for context in swap_info.tensors[1:]:  # the first is the master
            path, dtype = context.swap_path, context.compute_tensor.dtype
            if dtype.itemsize > self.dtype.itemsize:  # the store's buffers and slots are sized in the masters'
                raise TencacheConfigError(
                    f"{CONFIG_KEY}: optimizer state {os.path.basename(path)} is {dtype}, wider than its sub-group's "
                    f"{self.dtype} masters, in which tencache's optimizer tier sizes its buffers; keep the "
                    f"optimizer's state in the masters' dtype, or set zero_optimization.offload_optimizer.device "
                    f'"cpu"')
            if dtype == self.dtype:
                self._state_dtypes.pop(path, None)
            else:
                self._state_dtypes[path] = dtype

    def state_dtype(self, swap_info, key: str) -> torch.dtype:
        """The dtype of sub-group ``swap_info``'s state tensor ``key`` (the masters' unless noted otherwise)."""
        path = os.path.join(swap_info.swap_folder, swap_file_name(swap_info.param_id, key))
        return self._state_dtypes.get(path, self.dtype)

    def _stored_numel(self, path: str, numel: int) -> int:
        """The store's elements (the masters' dtype) that hold ``numel`` elements of the tensor at ``path``."""
        dtype = self._state_dtypes.get(path)
        return numel if dtype is None else stored_numel(numel, dtype, self.dtype)

    def _as_state(self, path: str, buffer: torch.Tensor, numel: int) -> torch.Tensor:
        """``buffer`` (the store's, in the masters' dtype) as the ``numel`` elements of the tensor at ``path``: the
        same bytes, viewed in the state's own dtype."""
        dtype = self._state_dtypes.get(path)
        return buffer if dtype is None else viewed_as(buffer, numel, dtype)

    def register_loaded_state(self, swap_info, parameter) -> None:
        """A load put state tensors of a sub-group that registered none yet (a fresh engine: Adam's moments, as
        full-size placeholders of their dtype; their bytes are the loaded swap files): registered now and emptied, as
        a step's give-back leaves a sub-group, without storing them. Left registered at the next swap-in instead, a
        save before any step held them as full-size tensors of no set value, and saved them as the moments in the
        ZeRO file (helper-192: a stock CPU offload load or `checkpoint-for-cpu` then took them for Adam's)."""
        if swap_info.has_state_tensors or swap_info.param_id in self._lent:
            return
        self._update_param_state_info(swap_info, parameter)
        swap_info.release_memory()

    def _give_back(self, parameter, states_changed: bool, gradient_changed: bool) -> None:
        swap_info = self.swap_params_info.get(OptimizerSwapper.parameter_id(parameter))
        if swap_info is None:
            return
        lent = set(self._lent.pop(OptimizerSwapper.parameter_id(parameter), ()))
        refused = False  # a state the step just created refused: then lent ones go back as they were lent
        try:
            try:
                self._update_param_state_info(swap_info, parameter)  # may refuse a state of another dtype
            except TencacheConfigError:  # (not an interrupt: Adam's new bytes are kept then, as after any step)
                refused = True
                raise
            finally:
                changed = states_changed and not refused
                master_elsewhere = False
                try:
                    try:
                        # a master the partitions hold now: its next update fills it from them, so keeping its
                        # buffer would save only its write (the store gives that room to tensors whose reads it saves)
                        master_elsewhere = self.masters.released(swap_info.param_id, changed)
                    finally:  # whatever that found, what was lent goes back
                        self._return_lent(swap_info, lent, changed, gradient_changed and not refused,
                                          master_elsewhere)
                except BaseException:  # what reached the store is not known: no copy of the master is trusted
                    self.masters.forget(swap_info.param_id)
                    raise
        except BaseException:
            if not refused:  # a give-back that raised: the step's new state is stored all the same (helper-209:
                # registered with no entry and no file, its next swap-in read a missing or an earlier run's file)
                self._store_new_state(swap_info, lent, raising=False)
            raise
        self._store_new_state(swap_info, lent, raising=True)

    def _store_new_state(self, swap_info, lent: set, raising: bool) -> None:
        """Store the state tensors the optimizer created in this step (its first for the sub-group: not ``lent``),
        then empty the sub-group's tensors. Each is tried whatever another's store raised; one that could not be
        stored is lost (``_lost_states``: its file was never written). ``raising`` False (a give-back raised
        already): a failure is logged, else the first is raised."""
        error = None
        try:
            for context in swap_info.tensors:
                if context.swap_path not in lent and context.compute_tensor.numel() > 0:  # the optimizer's: new
                    try:
                        self._store_new(context.swap_path, context.compute_tensor)
                    except BaseException as err:  # noqa: BLE001  (raised below, or the give-back's is)
                        self._lost_states[context.swap_path] = err
                        self._lost_groups.setdefault(swap_info.param_id, context.swap_path)
                        error = error or err
                        if not raising:
                            logger.warning("tencache: sub-group %s's new state %s could not be stored either: %s",
                                           swap_info.param_id, os.path.basename(context.swap_path), err)
        finally:
            swap_info.release_memory()
        if raising and error is not None:
            raise error

    def _refuse_lost_state(self, path: str) -> None:
        """A state whose first store failed is registered with no file (or an earlier run's, in a reused folder):
        its swap-in stops rather than read either (helper-220: the store's first failure left the others unstored
        too, and the next swap-in read a missing file or, silently, a stale one). Not in a load that takes the
        optimizer's state: its sub-group was started over for it (``_start_lost_sub_groups_over``)."""
        lost = self._lost_states.get(path)
        if lost is not None and not (self._checkpoint_load_pending and
                                     self._load_places in (LoadPlaces.ALL, LoadPlaces.STATE_WRITTEN)):
            raise TencacheError(
                f"optimizer state {os.path.basename(path)} was lost: its first store failed "
                f"({type(lost).__name__}: {lost}), and its file was never written. The optimizer's state is "
                "incomplete: load the last checkpoint (or destroy the engine and start again)")

    def _start_lost_sub_groups_over(self) -> None:
        """The sub-groups whose state was lost, as a fresh engine's: no state registered or held, the optimizer's
        emptied, so that the load registers the checkpoint's (its rebuild read the files never written, or an
        earlier run's: helper-232). Still refused until the load has placed the optimizer's state."""
        stage3 = self._stage3() if self._stage3 is not None else None
        base = getattr(stage3, "optimizer", None)
        for group in self._lost_groups:
            master = self.swap_params_info[group].tensors[0].compute_tensor
            if base is not None and master in base.state:
                base.state[master] = {}
            self.forget_state_tensors(master)

    def _return_lent(self, swap_info, lent: set, states_changed: bool, gradient_changed: bool,
                     master_elsewhere: bool) -> None:
        """Give back the entries in ``lent`` of sub-group ``swap_info``: its tensors (the master, the first, with
        ``master_elsewhere``: the parameter partitions hold it; changed for its file where it was lent with the
        debt of an owed master), and its gradient (discarded where it was a copy of fragments stage 3 still holds:
        nothing to keep or write). Every one goes back whatever another's give-back raised (a write refused as it
        starts leaves its entry DIRTY, its bytes held: cache/transfers.py), a Ctrl-C or SystemExit too (it skipped
        the rest: helper-193); the first error is raised after, an interrupt before any other. The caller no longer
        records them as lent: one left lent here would stay so for good, and the store's close would stop on it."""
        error = None
        master_owed = self.masters.take_debt(swap_info.param_id)
        for index, context in enumerate(swap_info.tensors):
            if context.swap_path not in lent:
                continue
            changed = states_changed or (index == 0 and master_owed)
            if index == 0 and changed:
                try:  # owed to its file, unwritten, where its partitions hold it (masters_in_partitions.py)
                    if self.masters.give_back_owed(swap_info.param_id, context.swap_path,
                                                   self.store.release_rewritten_elsewhere):
                        continue
                except BaseException as err:  # noqa: BLE001  (the store writes it below; raised once all went back)
                    error = _first_error(error, err, swap_info)
            try:
                self.store.release(context.swap_path, changed=changed,
                                   copy_elsewhere=master_elsewhere and index == 0)
            except BaseException as err:  # noqa: BLE001  (raised once all went back)
                error = _first_error(error, err, swap_info)
        if swap_info.has_gradients():
            path = gradient_path(swap_info)
            if path in lent:
                try:
                    self.gradients.give_back(swap_info.param_id, path, gradient_changed)
                except BaseException as err:  # noqa: BLE001  (raised once all went back)
                    error = _first_error(error, err, swap_info)
        if error is not None:
            raise error

    def check_no_master_lent_behind(self) -> None:
        """Raised at a save's start while a master is lent with its file's debt (masters_in_partitions.py)."""
        self.masters.check_none_lent_behind(self._lent)

    def step_started(self) -> None:
        """Stage 3's step() begins (install.py)."""
        self._updated_in_step = 0

    def step_ended(self, raised: bool, updated: int = 0) -> None:
        """Stage 3's step() ended; ``raised``: with an error or an interrupt, after ``updated`` sub-groups' updates
        by their step counts (the swap-outs count those swapped). One that raised after updating some sub-groups
        left the others at the step before: no save of a whole step can be made until a step ends or a load
        replaces the state."""
        updated = max(updated, self._updated_in_step)
        if not raised:
            self.update_stopped_part_way = 0
        elif updated:
            self.update_stopped_part_way = updated

    def check_none_lent(self) -> None:
        """Raised at a save's start while a sub-group is swapped in: an optimizer step (or a fragment call) stopped
        between its swap-in and its swap-out, leaving that sub-group's update half done. The save went on, wrote the
        model's files, and stopped at the flush of the lent gradient ("cannot flush while tensors ... are lent"), a
        part-written checkpoint, that rank alone (helper-177). Also after a step that stopped between two
        sub-groups, none lent: the ones before were updated, the others not (helper-220: the save went on, a
        checkpoint of two steps at once)."""
        if self._lent:
            groups = sorted(str(group) for group in self._lent)
            raise TencacheError(
                f"save_checkpoint: optimizer sub-groups {groups[:5]} are still swapped in: an optimizer step or a "
                f"fragment call stopped part way (an exception, Ctrl-C), and their update is half done, so no "
                f"checkpoint of a whole step can be taken now. Save from the last step that ended, or destroy the "
                f"engine and load the last checkpoint. Nothing was written")
        for path in self._lost_states:
            self._refuse_lost_state(path)  # (its message: a save of that state would link a file never written)
        if self.update_stopped_part_way:
            raise TencacheError(
                "save_checkpoint: the last optimizer step stopped part way (an exception, Ctrl-C) after updating "
                f"{self.update_stopped_part_way} of {len(self.swap_params_info)} optimizer sub-groups, so no "
                "checkpoint of a whole step can be taken now. Save from the last step that ended, or load the last "
                "checkpoint (or train a step on: its save is allowed again). Nothing was written")

    def settle_master_writes(self, groups=None, but=()) -> None:
        """Write the masters ``groups`` (None: all) but those in ``but`` owe their files from the partitions, and
        wait: before those files are read or replaced other than through a swap-in that fills them
        (checkpoint_save.py reads them directly, but those the ZeRO file's writer settles: ``master_settled_with``)."""
        masters = getattr(self, "masters", None)  # (None until __init__ made it)
        if masters is not None:
            masters.settle(groups, but)

    def master_settled_with(self, group, then=None):
        """A context manager: ``settle_master_writes`` of ``group`` alone, yielding the host memory its master file's
        bytes are written from, valid inside only (None where it owed nothing: its file is current). A checkpoint's
        ZeRO file writes the master from there (checkpoint_save.py), and names the one it writes next (``then``),
        whose fill from its partitions starts meanwhile."""
        return self.masters.settled_with(group, then)

    def owed_master_groups(self) -> frozenset:
        """The sub-groups whose master files are behind their partitions now (``settle_master_writes`` writes
        them)."""
        masters = getattr(self, "masters", None)
        return frozenset(group for group in self.swap_params_info if masters is not None and masters.owed(group))

    def master_in_host_memory(self, group) -> Optional[list]:
        """Views of the parameter partitions that hold ``group``'s master now (their bytes one after the other are
        its bytes), or None (masters_in_partitions.py ``views``): what a checkpoint's ZeRO file takes the master from
        instead of reading its file."""
        return self.masters.views(group)

    def _paths_to_read(self, swap_info) -> list:
        """The files of the sub-group's master and state tensors that its update reads: all but a master the
        parameter partitions hold in host memory (copied from them at the swap-in instead). A master whose file is
        behind partitions some of which are on file is read from those (``_owed_master_fill``)."""
        paths = [context.swap_path for context in swap_info.tensors]
        if self.store.copyable(paths[0]) and self.masters.current(swap_info.param_id):
            return paths[1:]
        return paths

    def _owed_master_fill(self, path):
        """The store asks at every read of a tensor on file (OptimizerStore ``read_from_copies``): where ``path`` is
        a master whose file is behind its parameter partitions (owed: master_write_behind.py), the fill that reads it
        from them (copied from host memory, read from their files), so that its stale file is never read; else
        None."""
        match = SWAP_FILE_NAME.match(os.path.basename(path))
        if match is None or match["state"] is not None:  # a moment's or a gradient's file: never owed
            return None
        group = match["id"]
        info = self.swap_params_info.get(group)
        if info is None or not info.tensors or info.tensors[0].swap_path != path or not self.masters.owed(group):
            return None
        return functools.partial(self.masters.fill, group)

    def _master_in_partitions(self, group, path) -> bool:
        """Will the swap-in fill the sub-group's master (its entry at ``path``) from the parameter partitions? Where
        they hold it in host memory, or its file is behind them (filled then from wherever they are, some read from
        their files), and the store would take the copy (on file, without a prefix of its own: lend_copied)."""
        return self.store.copyable(path) and (self.masters.current(group) or self.masters.owed(group))

    def master_copied_to_partitions(self, sub_group_index: int, master) -> None:
        """Stage 3 has copied sub-group ``sub_group_index``'s fp32 ``master`` into its parameter partitions
        (``_partitioned_params_swap_out``, after the sub-group's update, at initialisation and at checkpoint loads:
        install.py): while it is lent, that makes the partitions a copy of the master it is given back with."""
        group = OptimizerSwapper.parameter_id(master)
        self.masters.copied_to_partitions(sub_group_index, group, lent=group in self._lent)

    def forget_master_copies(self) -> None:
        """The swap files are being replaced or rebuilt: no partition is known to hold what they will (what the
        partitions owe the files is written first, so that it cannot land over the new files)."""
        self.masters.forget_all()


@dataclasses.dataclass
class CheckpointTotals:
    """What this swapper's checkpoint saves and loads did, in all (integrations/deepspeed/checkpoint_save.py counts
    them; ``stats()`` reports them as ``optimizer_checkpoint_*``): swap files placed in checkpoints (saves) or taken
    from them (loads), how many of those were linked rather than copied, the bytes the copies wrote; and the ZeRO
    files saved with their masters' bytes taken from the swap files or host memory (io/save_from_files.py: the bytes
    shared with the swap files where the file system clones, copied from them, and written from memory: the host
    tier's copies, the parameter partitions that hold masters, the small tensors) and those that fell back to the
    usual save. A ZeRO file saved by another checkpoint engine than torch's is not counted here."""
    folder_files: int = 0
    folder_files_linked: int = 0
    folder_bytes_written: int = 0
    zero_files_from_swap_files: int = 0
    zero_file_shared_bytes: int = 0
    zero_file_copied_bytes: int = 0
    # ... of them, masters the save had just written (io/save_from_files.UncachedFile): read through the O_DIRECT
    # engine, which reads buffered where the file system has no O_DIRECT
    zero_file_copied_uncached_bytes: int = 0
    zero_file_written_bytes: int = 0
    # ... of them, masters written from the copy their settle filled for their swap files (FilledWhenWritten)
    zero_file_written_with_master_settle_bytes: int = 0
    zero_files_saved_usual_way: int = 0

    def add_folder(self, transfer) -> None:
        self.folder_files += transfer.files
        self.folder_files_linked += transfer.linked
        self.folder_bytes_written += transfer.bytes_written

    def add_zero_file(self, done) -> None:
        """``done``: io/save_from_files.py's SavedFromFiles, or None where the file was saved the usual way
        instead."""
        if done is None:
            self.zero_files_saved_usual_way += 1
            return
        self.zero_files_from_swap_files += 1
        self.zero_file_shared_bytes += done.cloned_bytes
        self.zero_file_copied_bytes += done.copied_bytes
        self.zero_file_copied_uncached_bytes += done.copied_uncached_bytes
        self.zero_file_written_bytes += done.written_bytes
        self.zero_file_written_with_master_settle_bytes += done.filled_when_written_bytes


class _PoolView:
    """What OptimizerStateSwapInfo asks of an aio handle (``is_pinned``: does a tensor need a bounce copy)."""

    def __init__(self, pool: BufferPool):
        self._pool = pool

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return self._pool.owns(tensor)


def _first_error(first: Optional[BaseException], another: BaseException, swap_info) -> BaseException:
    """The error a give-back raises once every tensor went back: the first, or the first interrupt (KeyboardInterrupt,
    SystemExit: the user's, which an error must not hide); any other is logged, not lost."""
    if first is None:
        return another
    if isinstance(first, Exception) and not isinstance(another, Exception):
        first, another = another, first
    logger.warning("tencache: giving back sub-group %s also failed with %s: %s (the first error is raised)",
                   swap_info.param_id, type(another).__name__, another)
    return first
