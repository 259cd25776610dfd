"""Putting tencache's swappers where DeepSpeed looks them up. Owns: the name rebinding and its undo, and the
config check at ``deepspeed.initialize``.

DeepSpeed builds its swappers by module-global name at call time (deepspeed-integration.md, b):
``partition_parameters.AsyncPartitionedParameterSwapper`` in zero.Init, and ``stage3.PartitionedOptimizerSwapper``
/ ``stage3.PipelinedOptimizerSwapper`` in the ZeRO-3 optimizer. Rebinding those names reaches every path that
builds ZeRO-3 parameters: a user's zero.Init, Hugging Face's from_pretrained/from_config under ZeRO-3, and the
engine's own conversion of a model built outside zero.Init. Our classes return the stock ones when a config has
no enabled "tencache" block, so installing changes nothing for such runs.

What is rebound, and why, is listed in contract.py (REBINDINGS): this module builds the replacements and puts them
in. ``deepspeed.initialize`` is wrapped too, to validate the config before DeepSpeed reads it: a block that can
never take effect (ZeRO stage 1/2, or nothing offloaded to NVMe) means no swapper is ever built, so without this
check the run would silently be stock DeepSpeed; and our message for a block misplaced inside
"zero_optimization" comes before DeepSpeed's pydantic one.
"""
import contextlib
import functools
import os
import inspect
import threading
from typing import Optional

import deepspeed
import deepspeed.runtime.engine as _engine
import deepspeed.runtime.zero.parameter_offload as _parameter_offload
import deepspeed.runtime.zero.partition_parameters as _partition_parameters
import deepspeed.runtime.zero.stage3 as _stage3
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus

from ...config import CONFIG_KEY, NO_AUTO_INSTALL_ENV
from ...errors import TencacheError
from ...ext_lock import raise_if_stale_locks
from ...log import logger
from . import contract, reporting
from .agreement import raised_on_every_rank
from .adam_beta_products import record_beta_products, with_products_saved
from .checkpoint import (adopt_loaded_files, loading_checkpoint, masters_from_loaded_weights,
                         refresh_masters_swapping_in, regather_persistent_parameters, replay_adam_step_products,
                         restore_optimizer_scalars, restore_unswapped_masters, restoring_masters_from_files,
                         rigid_load_with_params_on_file, tencache_runs)
from .checkpoint_save import saving_masters, swap_files_linked
from .config_bridge import DEEPSPEED_OPS, building_stage3, find_stage3_optimizer, initializing, validate_ds_config
from .config_source import ds_config_of_initialize_call
from .coordinator import TencacheCoordinator, coordinator_of, restoring_kept_partitions
from .frozen_fragments import loading_frozen_fragments_into_files, reading_frozen_fragments_from_file
from .gradient_norms import attach_norm_scratch, norming_in_reused_memory, release_norm_scratch
from .master_write_behind import settle_owed_masters
from .memory_pressure import governor_of
from .one_rank_reduce import (marking_tencache_reductions, partitioning_each_gradient_at_once,
                              reducing_without_copy_at_one_rank)
from .optimizer_swapper import IN_STEP_ATTRIBUTE, TencacheOptimizerSwapper
from .param_swapper import TencacheParamSwapper, rewritten_in_place
from .refusal import (config_arguments_of, installed_as, installed_call, refuse_tencache_configs,
                      refuse_until_installed, unrefused)
from .stage3_gradients import handing_gradients_uncast, noting_gradient_scales
from .stats import METRICS_METER_ATTRIBUTE


def _validating(initialize):
    signature = inspect.signature(initialize)

    @functools.wraps(initialize)
    def validating_initialize(*args, **kwargs):
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:  # DeepSpeed reports a bad call itself
            bound = {}
        raw = ds_config_of_initialize_call(bound)
        checked = []

        def check():
            config = validate_ds_config(raw)
            if config.enabled:
                raise_if_stale_locks(ops=DEEPSPEED_OPS)  # cpu_adam loads below, before any swapper exists
            checked.append(config)

        if isinstance(raw, dict) and CONFIG_KEY in raw:
            # what one rank alone refuses (a path its node cannot write, a stale build lock there) stops every rank:
            # the others went on into the engine's collectives and waited for it (helper-213). Every rank passes
            # here with the same config, so the same "tencache" key decides alike. The ranks agree through
            # deepspeed.comm, which initialize's first step sets up: taken here first, as initialize takes it (a
            # script calling initialize without init_distributed, or after torch's init_process_group, agreed on
            # nothing: one rank stopped, the others waited in the rendezvous; helper-225)
            _init_distributed_as_initialize_does(signature, bound)
            raised_on_every_rank(check, lambda: TencacheError(
                "deepspeed.initialize: another rank refused this configuration (its error says why); stopped on "
                "every rank rather than leave this one waiting for it"))
        else:
            check()
        config = checked[0]
        # (what the optimizer swapper checks when it cannot find its own config; what a refusal inside passes on)
        with initializing(config), installed_call(config_arguments_of(bound)), _recording_builds() as built:
            try:
                return initialize(*args, **kwargs)
            except BaseException:
                _close_after_failed_initialize(built)
                raise

    return validating_initialize


_builds = threading.local()  # the ZeRO-3 optimizers and optimizer-less engines a deepspeed.initialize call built


@contextlib.contextmanager
def _recording_builds():
    """Within one ``deepspeed.initialize`` call: the list of what it built that holds tencache's swappers (a ZeRO-3
    optimizer once built, an optimizer-less engine's offload; ``_building_with_config``, ``_counting_offload_users``).
    Nested calls record their own."""
    outer, _builds.current = getattr(_builds, "current", None), []
    try:
        yield _builds.current
    finally:
        _builds.current = outer


def _record_build(built) -> None:
    current = getattr(_builds, "current", None)
    if current is not None:
        current.append(built)


def _close_after_failed_initialize(built) -> None:
    """``deepspeed.initialize`` raised after it built a ZeRO-3 optimizer (a client scheduler that raises, a check of
    the engine's after the optimizer's): no engine is returned, so no destroy will close what that optimizer holds.
    Its optimizer swapper's I/O threads and pinned slots, the governor's sampling thread and the parameter swappers'
    users it took are given back here, as the destroy would (helper-240's review: a sweep or a retry that went on in
    the same process found that swapper's share of the host tier taken, its threads alive, and the folder's
    parameter swapper, which the next zero.Init model there shares, never at rest after its engines' destroys). The
    call's own error is the one raised; one from a close is logged."""
    for thing in built:
        if isinstance(thing, _parameter_offload.DeepSpeedZeRoOffload):
            for swapper in thing.__dict__.pop(_OFFLOAD_USERS, ()):
                _close_logging_errors(swapper.release_user, "a deepspeed.initialize that failed")
        else:
            _close_logging_errors(functools.partial(close_swappers_of, thing), "a deepspeed.initialize that failed")


def _close_logging_errors(close, what: str) -> None:
    """A close after a failed build or call (``what``): its error is the one its caller catches, so one from the
    close is logged, not raised."""
    try:
        close()
    except Exception:  # noqa: BLE001
        logger.error("tencache: giving back the swappers of %s failed too", what, exc_info=True)


@contextlib.contextmanager
def _waking(swappers):
    """Wake the parameter swappers of an engine being built (``TencacheParamSwapper.wake``); where the build raises,
    those that were resting rest again unless a user took them (helper-242's review)."""
    resting = [swapper for swapper in swappers if getattr(swapper, "resting", False)]
    try:
        for swapper in swappers:  # (one that raises, its files gone: those woken before it rest again too)
            swapper.wake()
        yield
    except BaseException:
        for swapper in resting:
            _close_logging_errors(swapper.rest_unless_used, "an engine whose build failed")
        raise


# The job's size as launchers say it: torchrun and DeepSpeed's own, then those DeepSpeed finds by MPI discovery
# (OpenMPI, MPICH/Intel MPI's PMI, PMIx, MVAPICH, Slurm's srun: its openmpi/slurm/mvapich launchers set no
# WORLD_SIZE; helper-232)
JOB_SIZE_ENVS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")


def _init_distributed_as_initialize_does(signature, bound) -> None:
    """deepspeed.initialize's own first call, with the call's arguments (it finds the backend up when it makes it),
    where the job has several ranks: torch.distributed is up, or a launcher said so (JOB_SIZE_ENVS). One process
    alone agrees with nobody, and its refusal comes before the call's discovery of a launcher (MPI's, say)."""
    import torch.distributed

    from deepspeed import comm as dist
    from deepspeed.accelerator import get_accelerator

    several = torch.distributed.is_available() and torch.distributed.is_initialized() or any(
        os.environ.get(name, "").isdigit() and int(os.environ[name]) > 1 for name in JOB_SIZE_ENVS)
    if dist.is_initialized() or not several:
        return

    def argument(name):
        return bound.get(name, signature.parameters[name].default)

    dist.init_distributed(dist_backend=get_accelerator().communication_backend_name(),
                          distributed_port=argument("distributed_port"),
                          dist_init_required=argument("dist_init_required"))


def _release_device_tier(coordinator, module) -> None:
    """Parameters the device tier keeps gathered hold lent host buffers: partition them while the engine's structures
    still exist, so the swappers close or rest with nothing of theirs lent."""
    if coordinator is not None and coordinator.tier is not None:
        coordinator.release_and_reset_all(module)


def _closing_swappers(destroy):
    @functools.wraps(destroy)
    def destroy_and_close_swappers(self, *args, **kwargs):
        _release_device_tier(coordinator_of(self), self.parameter_offload.module)
        try:
            return destroy(self, *args, **kwargs)
        finally:
            release_norm_scratch(self)
            close_swappers_of(self)

    return destroy_and_close_swappers


_SWAPPERS_RELEASED = reporting.SWAPPERS_RELEASED


def close_swappers_of(optimizer, param_users: bool = True) -> None:
    """Close the tencache swappers a ZeRO-3 optimizer used: its optimizer swapper; its parameters' swappers rest
    once no other engine uses them (param_swapper.release_user; not where ``param_users`` is False: an optimizer
    whose build failed took none of them). Stock DeepSpeed leaves its swappers to the garbage
    collector; ours hold I/O threads, pinned memory and host-tier bytes, which a rebuilt engine in the same process
    needs. Once per optimizer: a second destroy of one engine must not take a user from a swapper another engine
    still trains with (stock tolerates a second destroy). Each part runs though one before it raised (that error is
    raised), since a second destroy will not retry."""
    if getattr(optimizer, _SWAPPERS_RELEASED, False):
        return
    setattr(optimizer, _SWAPPERS_RELEASED, True)
    try:
        governor = governor_of(optimizer)
        if governor is not None:
            governor.close()
    finally:
        try:
            swapper = getattr(optimizer, "optimizer_swapper", None)
            if isinstance(swapper, TencacheOptimizerSwapper):
                swapper.close()
        finally:
            for candidate in reporting.param_swappers_of_optimizer(optimizer) if param_users else ():
                candidate.release_user()


_OFFLOAD_USERS = "_tencache_param_swapper_users"


def _counting_offload_users(init):
    """``DeepSpeedZeRoOffload.__init__``. An engine without an optimizer (a DPO trainer's reference model, an
    evaluation engine) takes one as its optimizer: its model's parameter swappers count it as a user, as they count a
    ZeRO-3 optimizer (``_building_with_config``), so that its destroy puts them to rest (their slots and host-tier
    share given back). Not the one a ZeRO-3 optimizer builds for itself: that optimizer is the user."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def init_counting_users(self, *args, **kwargs):
        if find_stage3_optimizer() is not None:
            return init(self, *args, **kwargs)
        module = signature.bind_partial(self, *args, **kwargs).arguments.get("module")
        with _waking(reporting.param_swappers_of_module(module)):
            init(self, *args, **kwargs)
        # after: a model built outside zero.Init gets its swapper here (_convert_to_zero_parameters: helper-158)
        swappers = reporting.param_swappers_of_module(self.module)
        for swapper in swappers:
            swapper.add_user()
        setattr(self, _OFFLOAD_USERS, swappers)
        _record_build(self)

    return init_counting_users


def _resting_offload_users(destroy):
    """``DeepSpeedZeRoOffload.destroy``: an engine without an optimizer is destroyed (``_counting_offload_users``);
    once, as ``close_swappers_of``."""
    @functools.wraps(destroy)
    def destroy_and_rest_swappers(self, *args, **kwargs):
        swappers = self.__dict__.pop(_OFFLOAD_USERS, None)
        if swappers is None:  # a ZeRO-3 optimizer's own (its destroy closes), or destroyed already
            return destroy(self, *args, **kwargs)
        coordinator = self.get_param_coordinator()
        try:
            _release_device_tier(coordinator if isinstance(coordinator, TencacheCoordinator) else None, self.module)
        finally:
            try:
                return destroy(self, *args, **kwargs)
            finally:
                for swapper in swappers:
                    swapper.release_user()

    return destroy_and_rest_swappers


def _building_with_config(init):
    """The ZeRO-3 optimizer's __init__ with its config named for the optimizer swapper it builds (config_bridge.
    building_stage3), then metering of its steps from there on."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def init_with_config_and_meter(self, *args, **kwargs):
        arguments = signature.bind_partial(self, *args, **kwargs).arguments
        ds_config = arguments.get("ds_config")
        # a model given a new engine after its last one was destroyed: its resting parameter swapper counts as live
        # again before this optimizer's swapper takes its share of the host tier (host_tier_share.py)
        with _waking(reporting.param_swappers_of_module(arguments.get("module"))), \
                building_stage3(ds_config, optimizer=self):
            try:
                init(self, *args, **kwargs)
            except BaseException:
                # its optimizer swapper, where built (an arena or a file that failed in the states' first swap-in):
                # nothing else will close it. Its parameter swappers took no user from it yet.
                _close_logging_errors(functools.partial(close_swappers_of, self, param_users=False),
                                      "a ZeRO-3 optimizer whose build failed")
                raise
        for swapper in reporting.param_swappers_of_optimizer(self):  # released by its destroy (close_swappers_of)
            swapper.add_user()
        _record_build(self)
        reporting.attach_step_meter(self)
        attach_norm_scratch(self)  # after the governor: it marks an optimizer tencache swaps for
        if tencache_runs(self):  # its C++ beta products, for a resume to give them back (adam_beta_products.py)
            record_beta_products(getattr(self, "optimizer", None))

    return init_with_config_and_meter


def _saving_beta_products(state_dict):
    """stage 3's state dict (the ZeRO file's) with the C++ beta products' state beside it (adam_beta_products.py)."""
    @functools.wraps(state_dict)
    def state_dict_with_beta_products(self, *args, **kwargs):
        return with_products_saved(state_dict(self, *args, **kwargs), getattr(self, "optimizer", None))

    return state_dict_with_beta_products


def _marking_step(step):
    @functools.wraps(step)
    def step_marked(self, *args, **kwargs):
        governor = governor_of(self)
        if governor is not None:  # the rise meter: the backward's peak is measured apart from the update's
            governor.before_update()
        release_norm_scratch(self)  # the backward's norms are done: the update gets that memory
        swapper = getattr(self, "optimizer_swapper", None)
        ours = isinstance(swapper, TencacheOptimizerSwapper)
        steps_before = _sub_group_steps(self) if ours else None
        if ours:
            swapper.step_started()
        setattr(self, IN_STEP_ATTRIBUTE, True)
        raised = True
        try:
            meter = getattr(self, METRICS_METER_ATTRIBUTE, None)
            if meter is None:
                result = step(self, *args, **kwargs)
            else:
                result = meter.optimizer_step(lambda: step(self, *args, **kwargs))
            raised = False
            return result
        finally:
            setattr(self, IN_STEP_ATTRIBUTE, False)
            if ours:
                swapper.step_ended(raised, _sub_groups_stepped(steps_before, _sub_group_steps(self)) if raised else 0)

    return step_marked


def _sub_group_steps(stage3) -> list:
    """Each sub-group's optimizer step count (None where its optimizer keeps none)."""
    state = getattr(getattr(stage3, "optimizer", None), "state", {})
    steps = []
    for master in getattr(stage3, "fp32_partitioned_groups_flat", ()):
        step = state.get(master, {}).get("step") if master in state else None
        steps.append(None if step is None else float(step))
    return steps


def _sub_groups_stepped(before, after) -> int:
    """Sub-groups whose step count moved: those kept in memory too, which no swap-out counts (helper-228)."""
    return sum(1 for old, new in zip(before, after) if old != new)


def _reading_ahead_between_gradients(reduce_ready):
    """stage 3's reduce of each gradient as the backward produces it, then the optimizer swapper's reads ahead that
    were waiting for the last update's writes behind (cache/optimizer_reads_ahead.py): they start within the
    backward, not in the update."""
    @functools.wraps(reduce_ready)
    def reduce_ready_then_read_ahead(self, *args, **kwargs):
        result = reduce_ready(self, *args, **kwargs)
        swapper = getattr(self, "optimizer_swapper", None)
        if isinstance(swapper, TencacheOptimizerSwapper):
            swapper.gradient_reduced()
        return result

    return reduce_ready_then_read_ahead


def _fragment_call_within_releases_deferred(call, copy_view: bool, gradients_written: bool = False,
                                            reads_gradient: bool = True):
    """stage 3's fragment calls with the optimizer on NVMe, inside ``releases_deferred``.

    Getters (safe_get_full_fp32_param, _optimizer_state, _grad; their local variants) swap the sub-group in,
    release it, then gather from (full) or return (local) a view of it. Stock relies on its pool buffer keeping the
    bytes after the release; ours is a streaming slot or a held buffer that the next read or eviction gives to
    another tensor (with nothing held, safe_get_local_fp32_param's view showed the next tensor read). The release
    waits until the getter is done, and with ``copy_view`` a local getter's view on the host is copied (on a device
    it is a copy already).

    Setters (safe_set_*) swap the sub-group in, write, and swap it out: nothing is deferred for them. Either kind
    that raises after its swap-in, before it writes or releases (a state key the optimizer lacks, a gradient not
    there yet), gives the sub-group back unchanged instead of leaving it lent, where every later swap-in of it and
    every flush stopped. The vectorised gradient update (``gradients_written``) writes each parameter's fragment as
    it goes: one that raises part way through a sub-group gives it back with the fragments written so far, as stock
    CPU offload keeps them. A call on the masters or the state alone (``reads_gradient`` false) is lent the
    sub-group without its gradient, which it never touches."""
    @functools.wraps(call)
    def within_releases_deferred(self, *args, **kwargs):
        swapper = getattr(self, "optimizer_swapper", None)
        if not isinstance(swapper, TencacheOptimizerSwapper):
            return call(self, *args, **kwargs)
        with swapper.releases_deferred(gradients_written, reads_gradient):
            value = call(self, *args, **kwargs)
            if copy_view and value is not None and value.device.type == "cpu":
                value = value.clone()
        return value

    return within_releases_deferred


def _sized_by_the_partition(setter):
    """stage 3's local setters (safe_set_local_fp32_param, _optimizer_state, _grad) check the value's size against
    ``param.ds_tensor.numel()``, which for a partition on file with our parameter swapper is the one-element
    placeholder: a value of the partition's size was refused ("Number of elements do not match: N != N"), and one
    element passed and was broadcast over the whole fragment (helper-195). Here the value is checked against the
    partition's own size, with stock's message, and stock's check sees that size during the call."""
    @functools.wraps(setter)
    def set_sized_by_the_partition(self, value, param, *args, **kwargs):
        partition = getattr(param, "ds_tensor", None)
        swapper = getattr(param, "nvme_swapper", None)
        if partition is not None and partition.status == PartitionedParamStatus.INFLIGHT and \
                isinstance(swapper, TencacheParamSwapper):
            # a read a prefetch asked for and nothing waited for (an evaluation's last forward): its data is the
            # placeholder until it lands (helper-230: a value of the partition's size refused, one element
            # broadcast over it; frozen_fragments.py lands it so too)
            swapper.synchronize_reads()
        if partition is None or not param.requires_grad or \
                partition.status != PartitionedParamStatus.NOT_AVAILABLE or \
                not isinstance(getattr(param, "nvme_swapper", None), TencacheParamSwapper):
            return setter(self, value, param, *args, **kwargs)
        if value.numel() != partition.ds_numel:
            raise AssertionError(f" Number of elements do not match: {value.numel()} != {partition.ds_numel}")
        placeholder = partition.data
        partition.data = placeholder.reshape(1).expand(partition.ds_numel)  # (no memory: one element, stride 0)
        try:
            return setter(self, value, param, *args, **kwargs)
        finally:
            if partition.status == PartitionedParamStatus.NOT_AVAILABLE:  # (not swapped in meanwhile: its data stays)
                partition.data = placeholder

    return set_sized_by_the_partition


def _keeping_device_tier(partition_all_parameters):
    """stage 3's step() partitions every parameter before updating them; our coordinator keeps its device tier
    through that one call (checkpoints and the other callers still partition everything)."""
    @functools.wraps(partition_all_parameters)
    def partition_all_parameters_but_device_tier(self, *args, **kwargs):
        coordinator = coordinator_of(self)
        if coordinator is None or not getattr(self, IN_STEP_ATTRIBUTE, False):
            return partition_all_parameters(self, *args, **kwargs)
        return coordinator.release_for_optimizer_step(self.parameter_offload.module)

    return partition_all_parameters_but_device_tier


def _noting_master_copies(partitioned_params_swap_out):
    """stage 3 copies a sub-group's fp32 master into its parameter partitions (after its update, at
    initialisation, at loads): the optimizer swapper notes that they hold the master (master_copies.py), and the
    parameter swapper that those copied in place, resident, hold the newest bytes."""
    @functools.wraps(partitioned_params_swap_out)
    def partitioned_params_swap_out_noted(self, i, *args, **kwargs):
        try:
            result = partitioned_params_swap_out(self, i, *args, **kwargs)
        finally:  # stage 3 copies into the resident partitions first: where its swap-out of the others raised too
            rewritten_in_place(self.fp16_groups[i], self.fp16_partitioned_groups[i])
        swapper = getattr(self, "optimizer_swapper", None)
        if isinstance(swapper, TencacheOptimizerSwapper):
            swapper.master_copied_to_partitions(i, self.fp32_partitioned_groups_flat[i])
        return result

    return partitioned_params_swap_out_noted


def _restoring_optimizer_scalars(load_checkpoint):
    """engine.load_checkpoint, then what stock's load misses (checkpoint.py): the checkpoint's swap files under a
    rebuilt model's ids, the optimizer's scalar state and the masters kept in memory (optimizer on NVMe), and the
    running beta products of DeepSpeedCPUAdam (either device; not after a universal load)."""
    signature = inspect.signature(load_checkpoint)

    @functools.wraps(load_checkpoint)
    def load_checkpoint_exactly(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        load_dir, module_only = arguments["load_dir"], arguments["load_module_only"]
        optimizer_state = arguments["load_optimizer_states"] and not module_only
        if arguments.get("tag") is not None and tencache_runs(self.optimizer):
            # the tag as the engine's save names its folder (str(tag)): stage 3's copy of an NVMe swap folder joins
            # the tag itself, and an integer one (save_checkpoint(dir, tag=step)) stopped the load part way with a
            # TypeError, the weights loaded and the optimizer not (stock NVMe too; stock CPU offload loads it:
            # helper-243's review)
            arguments["tag"] = str(arguments["tag"])
        # the copies the optimizer store holds are dropped after the copy; the live state stays without a load of it
        with loading_checkpoint(self, optimizer_state, module_only):
            result = load_checkpoint(*bound.args, **bound.kwargs)
        renamed = 0 if module_only else adopt_loaded_files(self, load_dir, result[0])
        restore_optimizer_scalars(self, load_dir, result[0], arguments["load_optimizer_states"], module_only)
        if renamed + restore_unswapped_masters(self, load_dir, result[0], module_only):
            regather_persistent_parameters(self.optimizer)  # rebuilt after the engine's load had gathered them
        if result[0] is not None and optimizer_state:
            # not after a universal load (DeepSpeed's way to another world size, whose gradient reduction gives other
            # bits than the run that saved in any case): it resumes as stock CPU offload's universal load does
            if not self.load_universal_checkpoint():
                replay_adam_step_products(self, result[0])
        elif result[0] is not None:
            masters_from_loaded_weights(self.optimizer)
        if result[0] is not None:  # (a load that found no checkpoint changed nothing)
            reporting.restart_metering(self.optimizer, self.global_steps)
        return result

    return load_checkpoint_exactly


def _writing_owed_masters_first(partition):
    """Init._partition: where it writes gathered values into the partitions in place (``has_been_updated``), the
    fp32 masters owed from those partitions are written from them first (master_write_behind.py). Called at every
    parameter release: the flag is read without binding the call."""
    @functools.wraps(partition)
    def partition_after_owed_masters(self, param_list=None, *args, **kwargs):
        if kwargs.get("has_been_updated", args[1] if len(args) > 1 else False):
            settle_owed_masters(None if param_list is None else [param.ds_id for param in param_list])
        return partition(self, param_list, *args, **kwargs)

    return partition_after_owed_masters


def _gathering_after_owed_masters(enter):
    """GatheredParameters.__enter__: at one rank on a host accelerator the gathered tensor is the partition itself
    (DeepSpeed's NoGatherHandle), so code inside the context writes the partition in place, before ``_partition``
    runs at its exit: the masters owed from those partitions are written first (master_write_behind.py)."""
    @functools.wraps(enter)
    def enter_after_owed_masters(self):
        if self.enabled and self.params:
            settle_owed_masters([param.ds_id for param in self.params if hasattr(param, "ds_id")])
        return enter(self)

    return enter_after_owed_masters


def _micro_batches_done(engine, window: int) -> Optional[int]:
    """Micro-batches of the engine's gradient accumulation window done before this forward pass; None where the user
    marks the window's end (set_gradient_accumulation_boundary, or an unmanaged accumulation): not known here."""
    if not engine.managed_gradient_accumulation() or engine._is_gradient_accumulation_boundary is not None:
        return None
    return engine.micro_steps % window


def _governing_host_memory(forward):
    """engine.forward after a reading of the host's memory (memory_pressure.py): between two steps, the host tier
    gives memory back or takes it again, or the run stops with the numbers before the next step is started."""
    @functools.wraps(forward)
    def forward_within_host_memory(self, *args, **kwargs):
        governor = governor_of(getattr(self, "optimizer", None))
        if governor is not None:
            window = self.gradient_accumulation_steps()
            governor.before_forward(micro_batches_done=_micro_batches_done(self, window), window=window)
            reporting.log_startup_stats(self.optimizer)  # (once: every partition's slots are planned by now)
        return forward(self, *args, **kwargs)

    return forward_within_host_memory


def _ending_steps(post_step):
    @functools.wraps(post_step)
    def post_step_and_end_step(self, *args, **kwargs):
        result = post_step(self, *args, **kwargs)
        reporting.on_optimizer_step_end(self)
        return result

    return post_step_and_end_step


# The names contract.REBINDINGS gives the replacements: a class, or a function that wraps the original.
REPLACEMENTS = {
    "TencacheParamSwapper": TencacheParamSwapper,
    "TencacheOptimizerSwapper": TencacheOptimizerSwapper,
    "TencacheCoordinator": TencacheCoordinator,
    "validating_initialize": _validating,
    "closing_swappers": _closing_swappers,
    "counting_offload_users": _counting_offload_users,
    "resting_offload_users": _resting_offload_users,
    "building_with_config": _building_with_config,
    "ending_steps": _ending_steps,
    "marking_step": _marking_step,
    "saving_beta_products": _saving_beta_products,
    "governing_host_memory": _governing_host_memory,
    "writing_owed_masters_first": _writing_owed_masters_first,
    "gathering_after_owed_masters": _gathering_after_owed_masters,
    # exact resume, with the checkpoint's optimizer swap files linked rather than copied in (checkpoint_save.py)
    "restoring_optimizer_scalars": lambda load: _restoring_optimizer_scalars(swap_files_linked(load, "load")),
    "keeping_device_tier": _keeping_device_tier,
    "noting_master_copies": _noting_master_copies,
    "reading_ahead_between_gradients": _reading_ahead_between_gradients,
    "saving_masters": saving_masters,
    "reading_frozen_fragments_from_file": reading_frozen_fragments_from_file,
    "loading_frozen_fragments_into_files": loading_frozen_fragments_into_files,
    "linking_saved_swap_files": lambda save: swap_files_linked(save, "save"),
    "rigid_load_with_params_on_file": rigid_load_with_params_on_file,
    "refresh_masters_swapping_in": refresh_masters_swapping_in,
    "restoring_masters_from_files": restoring_masters_from_files,
    "handing_gradients_uncast": handing_gradients_uncast,
    "norming_in_reused_memory": norming_in_reused_memory,
    "noting_gradient_scales": noting_gradient_scales,
    "marking_tencache_reductions": marking_tencache_reductions,
    "partitioning_each_gradient_at_once": partitioning_each_gradient_at_once,
    "reducing_without_copy_at_one_rank": reducing_without_copy_at_one_rank,
    "restoring_kept_partitions": restoring_kept_partitions,
    "reading_full_fragment_before_release": lambda getter: _fragment_call_within_releases_deferred(getter, False),
    "copying_local_fragment_before_release": lambda getter: _fragment_call_within_releases_deferred(getter, True),
    "giving_back_when_a_setter_raises": lambda setter: _fragment_call_within_releases_deferred(setter, False),
    "reading_full_state_before_release":
        lambda getter: _fragment_call_within_releases_deferred(getter, False, reads_gradient=False),
    "copying_local_state_before_release":
        lambda getter: _fragment_call_within_releases_deferred(getter, True, reads_gradient=False),
    "giving_back_when_a_state_setter_raises":
        lambda setter: _fragment_call_within_releases_deferred(setter, False, reads_gradient=False),
    "giving_back_when_a_local_setter_raises":
        lambda setter: _fragment_call_within_releases_deferred(_sized_by_the_partition(setter), False),
    "giving_back_when_a_local_state_setter_raises":
        lambda setter: _fragment_call_within_releases_deferred(_sized_by_the_partition(setter), False,
                                                               reads_gradient=False),
    "keeping_gradients_written_when_an_update_raises":
        lambda update: _fragment_call_within_releases_deferred(update, False, gradients_written=True),
}


def _rebindings(supported: bool):
    """(owner, name, ours) for each entry of contract.REBINDINGS, wrappers built once around DeepSpeed's originals.
    On an unsupported DeepSpeed only the entry points that check the config (and so refuse a tencache config with
    the version error): the rest relies on private names that version may not have."""
    rebindings = []
    for entry in contract.REBINDINGS:
        if not (supported or entry.checks_config):
            continue
        try:
            owner = contract.resolve(entry.owner)
            original = unrefused(getattr(owner, entry.name))  # (not a refusal of configs while not installed)
        except (ImportError, AttributeError):
            if supported:
                raise
            continue  # that version has no such name: nothing to replace
        ours = REPLACEMENTS[entry.ours]
        rebindings.append((owner, entry.name, ours(original) if entry.wraps else ours))
    return tuple(rebindings)


SUPPORTED_DEEPSPEED = contract.version_problem(deepspeed.__version__) is None
_REBINDINGS = _rebindings(SUPPORTED_DEEPSPEED)
_originals = {}
_lock = threading.Lock()


def install() -> None:
    """Rebind DeepSpeed's swapper names to tencache's classes. Idempotent."""
    with _lock:
        for module, name, ours in _REBINDINGS:
            current = getattr(module, name)
            if current is not ours:
                _originals[(module.__name__, name)] = current
                setattr(module, name, ours)
            if module is deepspeed and name == "initialize":
                installed_as(ours)


UNINSTALLED = ("tencache_ds.uninstall() took tencache's swappers out of DeepSpeed: remove the block (or set its "
               '"enabled": false) to train stock DeepSpeed, or call tencache_ds.install() again')


def uninstall() -> None:
    """Restore DeepSpeed's own classes (for tests and for users who want stock back in-process). A config that
    enables tencache is then refused at deepspeed.initialize, not trained stock (helper-161's review)."""
    with _lock:
        for module, name, _ours in _REBINDINGS:
            original = _originals.pop((module.__name__, name), None)
            if original is not None:
                setattr(module, name, original)
        installed_as(None)
        refuse_tencache_configs(UNINSTALLED)


def initialize(*args, **kwargs):
    """``deepspeed.initialize`` after install(); same arguments, same return value."""
    install()
    return deepspeed.initialize(*args, **kwargs)


def is_installed() -> bool:
    return all(getattr(module, name) is ours for module, name, ours in _REBINDINGS)


# Importing this module directly (``import tencache_ds.integrations.deepspeed.install`` before DeepSpeed) imports
# DeepSpeed above, whose import hook (tencache_ds/__init__.py) cannot install from a module still being imported:
# install here instead, as ``import tencache_ds`` promises.
if os.environ.get(NO_AUTO_INSTALL_ENV) != "1":
    install()
else:
    refuse_until_installed()
