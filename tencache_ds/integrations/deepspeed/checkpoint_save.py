"""What a checkpoint saved under tencache holds, and how its swap files get there. Owns: the fp32 masters in the ZeRO
file, the swapped moments described there without bytes, and the swap folder's files linked into (and out of)
checkpoints instead of copied (below).

The masters. With the optimizer on NVMe, stage 3's ZeRO file (``zero_pp_rank_*_optim_states.pt``) saves each swapped
sub-group's fp32 master as the empty placeholder it is between steps; the bytes are only in the swap folder. So
``zero_to_fp32`` and ``load_state_dict_from_zero_checkpoint`` stop with "consumed N numels out of 0", and so does a
``load_checkpoint(load_optimizer_states=False)``, which reads the module's weights that way. Under tencache, the ZeRO
file gets every master: while the engine writes it, each placeholder shows the host tier's copy when it holds one,
else its swap file's bytes, mapped (torch.save reads them as it writes; nothing is copied into memory first). The
moments stay in the swap files only (putting them in the ZeRO file too would write all the optimizer state at every
save), and the ZeRO file describes them as meta tensors (``swapped_state_described``), so that a load that wants
them from there (stock CPU offload's) stops instead of running Adam on empty tensors (``tencache-ds
checkpoint-for-cpu`` writes them there, checkpoint_for_cpu.py). Stock's loaders read the rest as before: its NVMe
load the swap files, ``zero_to_fp32`` the masters. The masters are shown only while the engine's save runs, so a
checkpoint engine that may serialise them later is given copies of its own (below; the moments' meta tensors hold
no bytes to copy).
With torch's own checkpoint engine (zip files, torch >= 2.6) the ZeRO file is saved in two passes that take each
mapped master's bytes from its swap file, or from host memory that holds them (io/save_from_files.py). Where the
checkpoint and the swap folder share a file system that clones ranges (XFS, btrfs: io/reflink.py), the masters are
not written at all: each swap file is made current (what the host tier holds changed is written, as it is owed
anyway) and its blocks are shared with the ZeRO file, so the save writes the dirty bytes, not the masters. Where
nothing clones (ext4) the masters are written once more, through O_DIRECT: from host memory where it holds them (the
host tier's copies; in a model trained in fp32, the parameter partitions the parameter tier keeps, which are the
masters bit for bit: master_copies.py), else copied from their files (read through the page cache). A master owed
to its file whose partitions are not all in host memory (they stream: master_write_behind.py) is settled as the
writer reaches it, and the ZeRO file is written from the copy the settle fills for its swap file, while that file's
writes are in flight: the partitions' files are read once for both, and the master file just written is not read
back (``MasterSources``; a save that falls back to torch.save settles them all first). (torch.save's own writer, used
before, read the mapped files page by page, computed each record's CRC-32 and wrote through the page cache.)
"""
import collections
import contextlib
import functools
import inspect
import os
import shutil
import threading
import time
from dataclasses import dataclass

import torch
from deepspeed.checkpoint.ds_to_universal import dp_index_to_str
from deepspeed.runtime.checkpoint_engine.fast_checkpoint_engine import FastCheckpointEngine
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
from deepspeed.runtime.swap_tensor.optimizer_utils import OptimizerSwapper

from ...cache.entry import EntryState
from ...errors import TencacheError, TencacheOutOfMemory, TencacheResourceError
from ...io import save_from_files
from ...io.save_from_files import FilledWhenWritten, UncachedFile
from ...io.reflink import block_size, clones_between
from ...io.shared_files import place, room_to_write_again
from ...log import logger
from ...memory.descriptor_shared import copied_into_dev_shm, empty_shared_by_descriptor
from ...probes.host_memory import read_host_memory
from ...probes.limits import local_world_size
from ...units import fmt_bytes
from .agreement import raised_on_every_rank
from .optimizer_swapper import TencacheOptimizerSwapper


# Checkpoint engines whose save() has serialised the state dict by the time it returns, in this process: they may be
# shown the host tier's own buffers and mapped swap files. Any other gets copies of its own (``masters_shown``):
# DeepSpeed's decoupled writer pickles the state dict into a queue, which moves each tensor's storage into shared
# memory in place, and writes it from another process later. A mapped swap file cannot be moved so ("OSError: [Errno
# 9] Bad file descriptor" at the queue's put: found emulating that writer on the CPU accelerator, where DeepSpeed's
# own needs a GPU; tests/deepspeed/queued_checkpoint.py), and a buffer of the host tier's must not have its storage
# moved under the store. The copies are memory files (memory/descriptor_shared.py): the queue shares them by
# descriptor, where anonymous copies went into /dev/shm, which a container's 64 MiB stopped ("unable to allocate
# shared memory").
SERIALISED_DURING_SAVE = (TorchCheckpointEngine, FastCheckpointEngine)


def serialises_during_save(checkpoint_engine) -> bool:
    """Has ``checkpoint_engine.save`` serialised what it was given when it returns (one of DeepSpeed's synchronous
    engines, not a subclass that may do otherwise)?"""
    return type(checkpoint_engine) in SERIALISED_DURING_SAVE


class MasterSources(dict):
    """{master's data_ptr: where io/save_from_files.py takes its bytes} (``masters_shown``), and the masters whose
    swap files the ZeRO file's writer settles as it reaches them (FilledWhenWritten): shown mapped from files that
    are behind until then, so a save the usual way settles them first (``make_files_current``)."""

    def __init__(self, swapper=None):
        super().__init__()
        self._swapper = swapper
        self._settled_by_the_writer = []  # (master, swap file, group), in the order the masters are shown

    def settled_by_the_writer(self, master, path: str, group) -> None:
        """``master``'s file (``path``) is settled by the ZeRO file's writer from the copy the settle fills (one
        fill for both: no read of the file just written)."""
        self._settled_by_the_writer.append((master, path, group))
        self[master.untyped_storage().data_ptr()] = FilledWhenWritten(
            functools.partial(self._settled_master, group, path, master.numel()))

    def settled_after(self, group):
        """The group the writer is expected to settle after ``group`` (the ZeRO file holds the masters in the order
        they are shown: stage 3's sub-groups), or None: its fill starts while ``group``'s writes run."""
        groups = [each for _master, _path, each in self._settled_by_the_writer]
        index = groups.index(group) if group in groups else len(groups)
        return groups[index + 1] if index + 1 < len(groups) else None

    @contextlib.contextmanager
    def _settled_master(self, group, path: str, numel: int):
        """The bytes of sub-group ``group``'s master, for the ZeRO file: the memory its settle writes its file from,
        or where it was settled since (its file current), the file mapped."""
        with self._swapper.master_settled_with(group, then=self.settled_after(group)) as written_from:
            yield written_from if written_from is not None else \
                [torch.from_file(path, shared=False, size=numel, dtype=self._swapper.dtype)]

    def make_files_current(self) -> None:
        """Before ``torch.save`` reads the masters shown mapped (a save the usual way): the files the writer would
        have settled are settled now, and mapped again (a settle may replace a file linked into a checkpoint)."""
        if self._settled_by_the_writer:
            self._swapper.settle_master_writes()
            for master, path, _group in self._settled_by_the_writer:
                master.data = torch.from_file(path, shared=False, size=master.numel(), dtype=self._swapper.dtype)


@contextlib.contextmanager
def masters_shown(optimizer, from_files: bool = False, copies: bool = False, settled_by_the_writer: bool = False):
    """While inside: each swapped-out fp32 master of a ZeRO-3 optimizer under tencache's optimizer swapper is the
    host tier's copy when it holds one (unless ``from_files``), else its swap file's bytes (made current first),
    mapped read-only; ``copies``: a copy of those bytes in a memory file of its own instead, for a checkpoint engine
    that pickles them in its save and writes them later (the room for them checked at the save's start:
    ``_refuse_save_on_any_rank``). Afterwards the placeholders are back. Yields, for the masters shown from files (never
    for copies), MasterSources {master's data_ptr: where io/save_from_files.py takes its bytes}: the views of the
    parameter partitions that hold them (a model trained in fp32 whose partitions the host tier keeps; not
    ``from_files``), else its swap file (whose first bytes are the master's). ``settled_by_the_writer`` (a save in two
    passes that writes the masters, not ``from_files``): a master owed to its file and not in host memory is settled
    as the ZeRO file's writer reaches it, which writes it from the copy the settle fills rather than read the file
    back (the save's reads of the masters, halved)."""
    swapper = getattr(optimizer, "optimizer_swapper", None)
    shown, lent, sources = [], [], MasterSources(swapper)
    try:
        if isinstance(swapper, TencacheOptimizerSwapper):
            # the files read below: what the partitions owe them first, written through O_DIRECT where aligned
            # (not expected in the page cache: the ZeRO file's copy reads those through O_DIRECT too), but those the
            # ZeRO file's writer settles as it reaches them
            just_written = swapper.owed_master_groups()
            by_the_writer = frozenset(
                group for group in just_written if swapper.master_in_host_memory(group) is None) \
                if settled_by_the_writer and not from_files and not copies else frozenset()
            swapper.settle_master_writes(but=by_the_writer)
            # (room for copies: checked before the engine's save wrote anything, agreed over the ranks:
            # _refuse_save_on_any_rank)
            for master, info in _swapped_masters(optimizer, swapper):
                # recorded before it is shown or lent, so that an interrupt in between leaves neither behind (a
                # master left mapped is skipped by the next save's _swapped_masters: helper-202)
                shown.append(master)
                path = info.tensors[0].swap_path  # the master: the first tensor of its swap info
                held = swapper.store.knows(path) and swapper.store.kept(path)
                if held and not from_files and swapper.store.state(path) != EntryState.READING:
                    view = swapper.store.lend(path)
                    if copies:
                        try:
                            master.data = _copy_for_a_later_writer(view)
                        finally:
                            swapper.store.release(path)
                    else:
                        lent.append(path)
                        master.data = view  # the host tier's copy itself: no read, no copy
                else:  # on file: current there once what the tier holds changed, or an eviction's write, is done
                    if swapper.store.knows(path):
                        swapper.store.flush_key(path)
                    # the swapper's dtype: a swapped-out master is stock's placeholder, an empty fp32 tensor,
                    # whatever the masters' dtype (bf16 with bf16_master_weights_and_grads)
                    mapped = torch.from_file(path, shared=False, size=info.numel(), dtype=swapper.dtype)
                    master.data = _copy_for_a_later_writer(mapped) if copies else mapped
                    if not copies:  # (where the save is not in two passes, torch.save reads the mapped file)
                        in_memory = None if from_files else swapper.master_in_host_memory(info.param_id)
                        if in_memory is not None and sum(view.numel() for view in in_memory) != info.numel():
                            in_memory = None  # (never seen) this master from its file, not the whole file the usual way
                        if info.param_id in by_the_writer:
                            sources.settled_by_the_writer(master, path, info.param_id)
                        else:
                            on_file = UncachedFile(path) if info.param_id in just_written else path
                            sources[master.untyped_storage().data_ptr()] = on_file if in_memory is None else in_memory
        yield sources
    finally:
        for master in shown:
            master.data = torch.Tensor()  # stock's placeholder (optimizer_utils SwapTensorContext.release_memory)
        for path in lent:
            swapper.store.release(path)


def _swapped_masters(optimizer, swapper):
    """(master, swap info) of each fp32 master swapped out now (not swapped, or swapped in now: shown as it is)."""
    return [(master, info) for master in optimizer.fp32_partitioned_groups_flat
            for info in [swapper.swap_params_info.get(OptimizerSwapper.parameter_id(master))]
            if info is not None and master.numel() == 0]


def _refuse_save_on_any_rank(engine, swapper) -> None:
    """Before the engine's save writes any file: raise where this rank cannot save (a master lent with its file
    behind; a sub-group left swapped in by a step that stopped part way; no room for the copies a checkpoint engine
    that writes after its save returns is given), and on every rank where any rank cannot. Decided later, each rank
    on its own, a refusal came after that rank's model file was queued, while the other ranks went on into the
    save's barrier (helper-144's review). The copies' room counts every rank of this node (each makes its own, from
    the same memory)."""
    def check():
        swapper.check_no_master_lent_behind()
        swapper.check_none_lent()
        if not serialises_during_save(engine.checkpoint_engine):
            own = sum(info.numel() * swapper.swap_element_size for _master, info in
                      _swapped_masters(engine.optimizer, swapper))
            _check_room_for_copies(own * local_world_size())

    raised_on_every_rank(check, lambda: TencacheError(
        "save_checkpoint: another rank refused the save (its error says why); nothing was written"))


def _copy_for_a_later_writer(source: torch.Tensor) -> torch.Tensor:
    """``source``'s bytes in a memory file of their own, which the writer's queue shares by its descriptor instead of
    copying it into /dev/shm (memory/descriptor_shared.py). One the OS cannot make is a TencacheOutOfMemory."""
    try:
        copy = empty_shared_by_descriptor(source.numel(), source.dtype)
    except (OSError, RuntimeError) as err:  # memfd_create, ftruncate; torch's mmap of the descriptor
        raise TencacheOutOfMemory(
            f"checkpoint.writer: the checkpoint engine may write the fp32 masters after its save returns, so it is "
            f"given copies of them, and a copy of {fmt_bytes(source.numel() * source.element_size())} could not be "
            f"made: {err}") from err
    return copy.copy_(source)


# What a refusal of copies says can be done instead
_WRITE_DURING_SAVE = ("Use a checkpoint engine that writes during the save: DeepSpeed's default, or "
                      '"checkpoint": {"writer": {"decoupled": false}} (the masters are then written from the swap '
                      "files)")


def _check_room_for_copies(nbytes: int, dev_shm: str = "/dev/shm") -> None:
    """Where torch's multiprocessing would copy ``nbytes`` of copies into /dev/shm all the same ("file_system"
    sharing strategy), ``dev_shm``'s free space; the host's memory for them."""
    if copied_into_dev_shm():
        stats = os.statvfs(dev_shm)
        free = stats.f_bavail * stats.f_frsize
        if nbytes > free:
            raise TencacheOutOfMemory(
                f"checkpoint.writer: the checkpoint engine may write the fp32 masters after its save returns, so it "
                f"is given copies of them, {fmt_bytes(nbytes)}, which torch's \"file_system\" sharing strategy "
                f"(torch.multiprocessing.set_sharing_strategy) puts in {dev_shm}, and it has {fmt_bytes(free)} free; "
                f"nothing was written. Use the default \"file_descriptor\" strategy, a larger {dev_shm}, or a "
                f"checkpoint engine that writes during the save")
    memory = read_host_memory()
    if nbytes > memory.available_bytes:
        raise TencacheOutOfMemory(
            f"checkpoint.writer: the checkpoint engine may write the fp32 masters after its save returns (DeepSpeed's "
            f"decoupled writer, or any engine but its synchronous ones), so it is given copies of them, "
            f"{fmt_bytes(nbytes)}, but the host has {fmt_bytes(memory.available_bytes)} available (bound by "
            f"{memory.bound_by}); nothing was written. {_WRITE_DURING_SAVE}")


@contextlib.contextmanager
def swapped_state_described(optimizer):
    """While inside: each swapped-out optimizer state tensor (Adam's moments) of a ZeRO-3 optimizer under tencache's
    optimizer swapper is, in the optimizer's state, a meta tensor of its true size and dtype (no bytes); afterwards
    the placeholder is back. Stage 3 saves the placeholder, an empty tensor, which stock DeepSpeed's load with the
    optimizer on cpu takes for Adam's moments: DeepSpeedCPUAdam's C++ step then wrote through it (a segmentation
    fault at the first resumed step, found loading a tencache checkpoint with stock CPU offload). A meta tensor stops
    that load before anything is set (torch's ``Optimizer.load_state_dict``: "Cannot copy out of meta tensor; no
    data!"), says the size, and costs nothing to write; the bytes are the checkpoint's swap files
    (``offloaded_tensors/``), which a load with the optimizer on NVMe reads."""
    swapper = getattr(optimizer, "optimizer_swapper", None)
    replaced = []  # (the sub-group's state, key, its placeholder)
    try:
        if isinstance(swapper, TencacheOptimizerSwapper):
            for master in optimizer.fp32_partitioned_groups_flat:
                info = swapper.swap_params_info.get(OptimizerSwapper.parameter_id(master))
                state = optimizer.optimizer.state.get(master) if info is not None else None
                for key, value in (state or {}).items():
                    if torch.is_tensor(value) and value.dim() > 0 and value.numel() == 0:  # swapped out
                        state[key] = torch.empty(info.numel(), dtype=swapper.state_dtype(info, key), device="meta")
                        replaced.append((state, key, value))
        yield
    finally:
        for state, key, placeholder in replaced:
            state[key] = placeholder


@contextlib.contextmanager
def _handed_over_as_its_own(checkpoint_engine):
    """While inside: ``checkpoint_engine.save`` is given a state dict of its own: new dicts, lists and tensor objects
    (each a view of the same storage: no bytes copied). Stage 3's state dict holds live objects (its list of fp32
    masters, torch's per-parameter state dicts), into which masters_shown and swapped_state_described put the
    copies and the moments' descriptions, and out of which they take them again when the save returns: an engine
    that serialises later (DataStates' background writer, one whose commit writes) found the empty placeholders
    there, not the masters."""
    before = checkpoint_engine.__dict__.get("save", _NOT_SET)  # a save set on the instance itself: put back after
    save = checkpoint_engine.save

    def save_its_own(state_dict, path, *args, **kwargs):
        return save(_own_tree(state_dict), path, *args, **kwargs)

    checkpoint_engine.save = save_its_own  # on the instance: the class's method stays as it is
    try:
        yield
    finally:
        if before is _NOT_SET:
            del checkpoint_engine.save
        else:
            checkpoint_engine.save = before


_NOT_SET = object()


def _own_tree(value):
    """``value`` with new dicts, lists and tuples all the way down (of their exact types; other containers as they
    are) and each tensor a new object over the same storage, as it would pickle (a parameter, requires_grad, its
    attributes). A tensor met twice becomes two objects (over one storage: torch.save writes the bytes once)."""
    if torch.is_tensor(value):
        own = value.detach()
        if isinstance(value, torch.nn.Parameter):
            own = torch.nn.Parameter(own, requires_grad=value.requires_grad)
        elif value.requires_grad:
            own.requires_grad_()
        own.__dict__.update(value.__dict__)  # what pickles with it (stage 3's masters carry their ds_id)
        return own
    if type(value) in (dict, collections.OrderedDict):
        return type(value)((key, _own_tree(item)) for key, item in value.items())
    if type(value) in (list, tuple):
        return type(value)(_own_tree(item) for item in value)
    return value


def saving_masters(save_zero_checkpoint):
    """engine._save_zero_checkpoint with the swapped masters in the file it writes (their swap files' blocks shared
    where the file system clones; else written from host memory that holds them, or copied from the files), and the
    swapped moments described (``swapped_state_described``)."""
    @functools.wraps(save_zero_checkpoint)
    def save_zero_checkpoint_with_masters(self, save_path, tag, *args, **kwargs):
        swapper = getattr(self.optimizer, "optimizer_swapper", None)
        two_pass = isinstance(swapper, TencacheOptimizerSwapper) and _saves_from_files(self.checkpoint_engine)
        # where the blocks can be shared, every master is shown from its file (made current); else what host memory
        # holds (the host tier's copies, the parameter partitions) is written from there: no read of its file (nor,
        # for the host tier's changed copies, a write to it first)
        sharing = two_pass and _can_share_blocks(
            swapper.files_folder, os.path.dirname(self._get_zero_ckpt_name(save_path, tag)))
        # (stock's run, tencache installed but not swapping this optimizer: its engine is given what stock gives it)
        copies = isinstance(swapper, TencacheOptimizerSwapper) and not serialises_during_save(self.checkpoint_engine)
        with masters_shown(self.optimizer, from_files=sharing, copies=copies, settled_by_the_writer=two_pass) \
                as sources, \
                swapped_state_described(self.optimizer), \
                (_handed_over_as_its_own(self.checkpoint_engine) if copies else contextlib.nullcontext()):
            if not two_pass:
                return save_zero_checkpoint(self, save_path, tag, *args, **kwargs)
            with _saving_from_files(self.checkpoint_engine, sources, swapper):
                return save_zero_checkpoint(self, save_path, tag, *args, **kwargs)

    return save_zero_checkpoint_with_masters


def _saves_from_files(checkpoint_engine) -> bool:
    """Can the ZeRO file take the masters' bytes from their swap files or host memory (io/save_from_files.py):
    torch's own checkpoint engine writing zip files, with a torch that saves in two passes, and no ``save`` of the
    instance's own (a framework's upload or hash, which the save from files would pass by: helper-202)?"""
    return (type(checkpoint_engine) is TorchCheckpointEngine and "save" not in vars(checkpoint_engine)
            and checkpoint_engine.zipfile_serialization and save_from_files.supported())


def _can_share_blocks(swap_folder: str, checkpoint_folder: str) -> bool:
    """Can the swap files share their blocks with files in the checkpoint's folder? Not where the ZeRO file's
    storages cannot start on its blocks (ZFS's 128 KiB records, NFS's wsize: helper-157's review): a probe there said
    yes, and the masters were written to their swap files first, then copied, instead of written once."""
    existing = os.path.abspath(checkpoint_folder)
    while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)  # the tag's folder may not be made yet: its file system is its parent's
    try:
        if not save_from_files.aligns_storages_to_blocks(block_size(existing)):
            logger.info("the ZeRO file's masters are written, not shared: %s's blocks of %s are larger than the "
                        "storages' alignment", existing, fmt_bytes(block_size(existing)))
            return False
        return clones_between(swap_folder, existing)
    except OSError as err:  # e.g. a folder we may not write the probe's files in: the masters are written
        logger.info("the ZeRO file's masters are written, not shared: %s", err)
        return False


@contextlib.contextmanager
def _saving_from_files(checkpoint_engine, sources, swapper):
    """While inside, ``checkpoint_engine.save`` writes its file with the masters' bytes taken from ``sources``
    (files, or host memory: io/save_from_files.py), or the usual way where that cannot account for the whole
    structure."""
    def save(state_dict, path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            done = save_from_files.save_from_files(state_dict, path, sources)
            why = "its structure could not be walked"
        except TencacheResourceError:  # a full disk, a folder that cannot be written: the usual save would fail too,
            raise                      # after writing the whole file again, with torch's word for it, not ours
        except Exception as err:  # pylint: disable=broad-except  (the usual save still makes the checkpoint)
            done, why = None, f"{type(err).__name__}: {err}"
        if done is None:
            logger.warning("the ZeRO file %s is written the usual way (masters not taken from the swap files): %s",
                           path, why)
            sources.make_files_current()  # torch.save reads the mapped masters
            TorchCheckpointEngine.save(checkpoint_engine, state_dict, path)
        else:
            logger.info("ZeRO file %s: %d bytes shared with the swap files, %d copied from them, %d written from "
                        "memory, in %.2f s", path, done.cloned_bytes, done.copied_bytes, done.written_bytes,
                        done.seconds)
        swapper.last_zero_file_save = done
        swapper.checkpoint_totals.add_zero_file(done)

    before = vars(checkpoint_engine).get("save")  # an instance's own save, if someone set one
    checkpoint_engine.save = save
    try:
        yield
    finally:
        if before is None:
            del checkpoint_engine.save  # the class's own method again
        else:
            checkpoint_engine.save = before


# ------------------------------------------------------------------------------------ the swap folder's files
# DeepSpeed's save copies the whole swap folder into the checkpoint (engine.py save_checkpoint: shutil.copytree of
# ``optimizer_swapper.swap_folder``, gradients skipped), and its load copies the checkpoint's files back over it: a
# 1B-parameter fp32 model's 12 GB of optimizer state each time, whatever changed since. Under tencache both copies
# are links instead (io/shared_files.py): the swap folder is flushed (the ``swap_folder`` property: what is dirty in
# the host tier), then each file gets a second name. Where the two folders are on different file systems, each file
# is written once: from the host tier's copy when it holds the tensor, else copied from the swap file. Swap files
# written after a save are new files (LinkSafeIO), so training never changes a checkpoint. The checkpoint's layout is
# stock's: stock's NVMe loader reads it as it reads its own.
_copytree_lock = threading.Lock()


@dataclass
class FolderTransfer:
    """What the last save or load of a swap folder did (for stats, tests and the benchmark)."""
    direction: str  # "save" or "load"
    files: int = 0
    linked: int = 0
    bytes_written: int = 0
    seconds: float = 0.0


def swap_files_linked(method, direction: str):
    """engine.save_checkpoint / load_checkpoint with its copy of the optimizer swap folder made by links."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def with_swap_files_linked(self, *args, **kwargs):
        swapper = getattr(getattr(self, "optimizer", None), "optimizer_swapper", None)
        if not isinstance(swapper, TencacheOptimizerSwapper):
            return method(self, *args, **kwargs)
        if direction == "save":  # before the engine writes any file of the checkpoint
            _refuse_save_on_any_rank(self, swapper)
            arguments = signature.bind(self, *args, **kwargs).arguments
            if self.checkpoint_tag_validation_fail():
                # the engine's own refusal of ranks that disagree on the tag (an AssertionError on every rank), asked
                # before this rank's swap files of an earlier save into its tag go: asked after, by the engine's save,
                # a refused save had destroyed the earlier checkpoints of both tags (helper-243's review)
                self._checkpoint_tag_validation(_tag_named(self, arguments.get("tag")))
            # in a round of its own, after the refusal's: a rank that removed its files while another refused
            # would leave the tag without them, where a refusal writes nothing
            raised_on_every_rank(
                lambda: _forget_earlier_swap_files(self, arguments["save_dir"], arguments.get("tag")),
                lambda: TencacheError("save_checkpoint: another rank could not remove its swap files of an earlier "
                                      "save into this tag (its error says why); the save stops on every rank"))
        with _copytree_linking(swapper, direction):
            return method(self, *args, **kwargs)

    return with_swap_files_linked


def _forget_earlier_swap_files(engine, save_dir, tag) -> None:
    """A save into a tag saved before: this rank's swap files of the earlier save go first, so that a save stopped
    part way (Ctrl-C, a full disk, preemption) leaves a checkpoint the load refuses as incomplete. The files were
    replaced one by one after the new model and ZeRO files: stopped between, the tag mixed new step counts with old
    masters and moments, and loaded without a word (helper-182's review; stock NVMe refuses a second save into a
    tag: its copytree's dirs_exist_ok=False). The folder is the one engine.save_checkpoint copies into. A ``save_dir``
    DeepSpeed refuses ("" or None) removes nothing: "" named the folder under the working directory (helper-192).
    The caller raises a removal that failed on any rank on every rank: one rank stopped here alone left the others
    in the save's barrier (helper-202)."""
    if not save_dir or not isinstance(save_dir, (str, os.PathLike)):  # DeepSpeed's save refuses it, with its error
        return
    rank = engine.local_rank if engine.use_node_local_storage() else engine.global_rank
    folder = os.path.join(save_dir, _tag_named(engine, tag), "offloaded_tensors", "rank" + dp_index_to_str(rank))
    if os.path.isdir(folder):
        shutil.rmtree(folder)


def _tag_named(engine, tag) -> str:
    """The tag ``engine.save_checkpoint`` names its folder by."""
    return f"global_step{engine.global_steps}" if tag is None else str(tag)


@contextlib.contextmanager
def _copytree_linking(swapper, direction: str):
    """While inside, ``shutil.copytree`` (which the engine imports at call time) links when its source (save) or
    destination (load) is ``swapper``'s folder; any other copy is the original's."""
    with _copytree_lock:
        original = shutil.copytree
        folder = os.path.realpath(swapper.files_folder)

        def copytree(src, dst, *args, **kwargs):
            if os.path.realpath(src if direction == "save" else dst) != folder:
                return original(src, dst, *args, **kwargs)
            swapper.last_folder_transfer = _link_folder(swapper, src, dst, kwargs.get("ignore"), direction)
            swapper.checkpoint_totals.add_folder(swapper.last_folder_transfer)
            return dst

        shutil.copytree = copytree
        try:
            yield
        finally:
            shutil.copytree = original


def _link_folder(swapper, source: str, target: str, ignore, direction: str) -> FolderTransfer:
    started = time.perf_counter()
    transfer = FolderTransfer(direction)
    if direction == "load":
        swapper.begin_load_copy(source)
        if not swapper.last_load_places.places_files:  # (the folder may not even exist: another world size)
            logger.info("load: no swap file placed from %s", source)
            return transfer
    names = sorted(name for name in os.listdir(source) if os.path.isfile(os.path.join(source, name)))
    skipped = set(ignore(source, names)) if ignore is not None else set()
    targets = {name: _target_name(swapper, name, direction) for name in names
               if name not in skipped and not name.startswith(".")}
    targets = {name: target_name for name, target_name in targets.items() if target_name is not None}
    os.makedirs(target, exist_ok=True)
    linked_bytes = 0
    placed_hidden = []
    try:
        for name, target_name in targets.items():
            source_path, target_path = os.path.join(source, name), os.path.join(target, target_name)
            placed = place(source_path, target_path, _fill_from_host_tier(swapper, source_path)
                           if direction == "save" else None)
            if direction == "load" and target_name.startswith("."):
                placed_hidden.append(target_path)
            transfer.files += 1
            transfer.linked += int(placed.linked)
            transfer.bytes_written += placed.bytes_written
            linked_bytes += os.path.getsize(source_path) if placed.linked else 0
    except BaseException:  # a load stopped part way: the copies placed hidden go now, not at the next load
        for path in placed_hidden:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise
    if direction == "load":  # every file placed: the live ones replaced at once (renames, which need no room)
        for name, target_name in targets.items():
            final = swapper.name_after_load_copy(name)
            if final is not None:
                os.replace(os.path.join(target, target_name), os.path.join(target, final))
    if direction == "save":  # (a tag saved before had its files removed first: _forget_earlier_swap_files)
        short_of_room = room_to_write_again(source, linked_bytes)
        if short_of_room is not None:
            logger.warning("checkpoint folder %s: %s", target, short_of_room)
    transfer.seconds = time.perf_counter() - started
    logger.info("%s %d swap files (%d linked, %d bytes written) from %s to %s in %.2f s", direction, transfer.files,
                transfer.linked, transfer.bytes_written, source, target, transfer.seconds)
    return transfer


def _target_name(swapper, name: str, direction: str):
    """The name the file ``name`` gets in the target folder, or None to leave it: a save takes this swapper's own
    files; a load places what ``load_target_name`` says (another sub-group's file hidden, for adoption)."""
    if direction == "save":
        return name if swapper.owns_file(name) else None
    return swapper.load_target_name(name)


def _fill_from_host_tier(swapper, path: str):
    """A writer of ``path``'s bytes from the host tier when it holds them (no read of the swap file), else None."""
    if not (swapper.store.knows(path) and swapper.store.kept(path)):
        return None

    def fill(handle):
        view = swapper.store.lend(path)
        try:
            # as bytes: numpy has no bfloat16, and bf16 masters (bf16_master_weights_and_grads) are held as such
            handle.write(memoryview(view.view(torch.uint8).numpy()))
        finally:
            swapper.store.release(path)

    return fill
