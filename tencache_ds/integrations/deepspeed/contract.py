"""What tencache assumes about DeepSpeed's insides, in one table. Owns: the supported DeepSpeed versions, every name
install.py rebinds, every private (or name-mangled, or undocumented) attribute and method the adapters read or
override, and every assumption about the order in which DeepSpeed calls them, each with why it is needed; and
``missing_from_deepspeed()``, which checks the first two against the installed DeepSpeed
(tests/deepspeed/test_contract.py runs it). Does not own: what the adapters do with them.

A DeepSpeed release may rename any of these without notice. Where one is gone, the code that relies on it would
fail late or, worse, silently (a device tier that never switches on, write-backs that never happen): so an
unsupported version refuses every config that enables tencache (``require_supported_deepspeed``, called by
config_bridge.validate_ds_config at zero.Init and deepspeed.initialize), and install.py then puts in only the
entry points that make that check (``Rebinding.checks_config``), so stock configs run DeepSpeed's own code.

Owners are written "module:Class" (or a bare module). Names are written as DeepSpeed's source spells them; a
name-mangled one (``self.__step_id`` in PartitionedParameterCoordinator) as ``__step_id``, except in a rebinding,
which install.py sets by the name the class holds (``_DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads``).
"""
import dataclasses
import importlib
import inspect
import re
from dataclasses import dataclass
from typing import List

from ...errors import TencacheConfigError
from ...supported_deepspeed import SUPPORTED_SERIES, TESTED_VERSION, version_problem


STAGE3 = "deepspeed.runtime.zero.stage3:DeepSpeedZeroOptimizer_Stage3"
ENGINE = "deepspeed.runtime.engine:DeepSpeedEngine"
ZERO_OFFLOAD = "deepspeed.runtime.zero.parameter_offload:DeepSpeedZeRoOffload"
COORDINATOR = "deepspeed.runtime.zero.partitioned_param_coordinator:PartitionedParameterCoordinator"
OPTIMIZER_SWAPPER = "deepspeed.runtime.swap_tensor.optimizer_utils:OptimizerSwapper"
PARAM_SWAPPER = "deepspeed.runtime.swap_tensor.partitioned_param_swapper:AsyncPartitionedParameterSwapper"
PARTITIONED_OPTIMIZER_SWAPPER = \
    "deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper:PartitionedOptimizerSwapper"
DS_CONFIG = "deepspeed.runtime.config:DeepSpeedConfig"
TORCH_CHECKPOINT_ENGINE = "deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine:TorchCheckpointEngine"


@dataclass(frozen=True)
class Rebinding:
    """``owner.name`` is set to ours by install.py (and put back by uninstall). ``ours`` names, in install.py's
    ``REPLACEMENTS``, a class that replaces the original, or (``wraps``) a function that wraps it."""
    owner: str
    name: str
    ours: str
    why: str
    wraps: bool = False
    checks_config: bool = False  # an entry point that validates the config (installed even on other versions)


@dataclass(frozen=True)
class PrivateMember:
    """A DeepSpeed attribute or method that is no public API, which the adapters read, call or override."""
    owner: str
    name: str
    # "method", "attribute" (an instance attribute DeepSpeed's __init__ assigns) or "field" (a dataclass field)
    kind: str
    used_in: str    # the adapter module that relies on it
    why: str

    @property
    def attribute(self) -> str:
        """The name as Python looks it up (a name-mangled one with its class: _Class__name)."""
        if self.name.startswith("__") and not self.name.endswith("__"):
            return f"_{self.owner.rsplit(':', 1)[-1].lstrip('_')}{self.name}"
        return self.name


@dataclass(frozen=True)
class CallOrder:
    """An assumption about when DeepSpeed calls something, which no type or name check can see."""
    assumption: str
    relied_on_in: str
    why: str
    checked_by: str  # the test that fails when it stops holding


REBINDINGS = (
    Rebinding("deepspeed.runtime.zero.partition_parameters", "AsyncPartitionedParameterSwapper",
              "TencacheParamSwapper", checks_config=True,
              why="zero.Init builds the parameter swapper by this module-global name at call time: every path that "
                  "builds ZeRO-3 parameters (a user's zero.Init, Hugging Face under ZeRO-3, the engine's own "
                  "conversion) then gets ours; it returns the stock swapper for a config without the block"),
    Rebinding("deepspeed.runtime.zero.stage3", "PartitionedOptimizerSwapper", "TencacheOptimizerSwapper",
              checks_config=True,
              why="stage 3's _configure_tensor_swapping picks the optimizer swapper by this module-global name"),
    Rebinding("deepspeed.runtime.zero.stage3", "PipelinedOptimizerSwapper", "TencacheOptimizerSwapper",
              checks_config=True,
              why="... or by this one when offload_optimizer.pipeline_read/pipeline_write is set"),
    Rebinding("deepspeed", "initialize", "validating_initialize", wraps=True, checks_config=True,
              why="user scripts, Hugging Face's Trainer and Accelerate look deepspeed.initialize up at call time: "
                  "the config is validated before DeepSpeed reads it (a block that could never take effect would "
                  "otherwise train stock, silently)"),
    Rebinding(STAGE3, "destroy", "closing_swappers", wraps=True,
              why="engine.destroy() -> optimizer.destroy(): our swappers hold I/O threads, pinned memory and "
                  "host-tier bytes, which a rebuilt engine in the same process needs back"),
    Rebinding(ZERO_OFFLOAD, "__init__", "counting_offload_users", wraps=True,
              why="an engine without an optimizer takes a DeepSpeedZeRoOffload as its optimizer: its model's "
                  "parameter swappers count that engine as a user, as they count a ZeRO-3 optimizer"),
    Rebinding(ZERO_OFFLOAD, "destroy", "resting_offload_users", wraps=True,
              why="... so that its destroy puts them to rest, giving back slots and host-tier bytes (stock's "
                  "destroy only takes the hooks off)"),
    Rebinding("deepspeed.runtime.zero.parameter_offload", "PartitionedParameterCoordinator", "TencacheCoordinator",
              why="ZeRO-3 builds its parameter coordinator by this module-global name: ours adds the device tier"),
    Rebinding(STAGE3, "__init__", "building_with_config", wraps=True,
              why="stage 3 builds its optimizer swapper without passing the config: the wrapper names it "
                  "(config_bridge.building_stage3); metering starts once the optimizer is built"),
    Rebinding(STAGE3, "_post_step", "ending_steps", wraps=True,
              why="the end of every optimizer step: write-backs, the memory governor and the per-step metrics "
                  "record hang on it"),
    Rebinding(STAGE3, "step", "marking_step", wraps=True,
              why="tells _partition_all_parameters called from step() (keep the device tier) from its other "
                  "callers (checkpoints: partition everything); the host governor's rise meter takes a boundary "
                  "between the last backward and the update"),
    Rebinding(ENGINE, "forward", "governing_host_memory", wraps=True,
              why="between two steps the host tier follows the host's memory (memory_pressure.py): before every "
                  "forward pass"),
    Rebinding(ENGINE, "load_checkpoint", "restoring_optimizer_scalars", wraps=True,
              why="stock's NVMe load path skips the optimizer's scalar state and a rebuilt model's swap files "
                  "(checkpoint.py): exact resume"),
    Rebinding(STAGE3, "_partition_all_parameters", "keeping_device_tier", wraps=True,
              why="step() partitions every parameter first; the device tier keeps the ones the step updates in "
                  "place (coordinator.release_for_optimizer_step)"),
    Rebinding(STAGE3, "_partitioned_params_swap_out", "noting_master_copies", wraps=True,
              why="stage 3 copies each sub-group's fp32 master into its parameter partitions there: in fp32 the "
                  "partitions the parameter swapper holds are then the master, which the next update fills from "
                  "them instead of reading its file (master_copies.py)"),
    Rebinding(STAGE3, "reduce_ready_partitions_and_remove_grads", "reading_ahead_between_gradients", wraps=True,
              why="each gradient's hook calls it through the instance as the backward produces the gradient: "
                  "the optimizer's reads ahead that waited for the last update's writes behind start there, "
                  "within the backward (cache/optimizer_reads_ahead.py)"),
    Rebinding(ENGINE, "_save_zero_checkpoint", "saving_masters", wraps=True,
              why="with the optimizer on NVMe the fp32 masters live only in the swap folder: they go into the "
                  "ZeRO file, so zero_to_fp32 and load_state_dict_from_zero_checkpoint read the checkpoint "
                  "(checkpoint_save.py)"),
    Rebinding(ENGINE, "_get_param_fragment_func", "reading_frozen_fragments_from_file", wraps=True,
              why="a frozen parameter's fragment in the checkpoint is its ds_tensor: for a partition on NVMe the "
                  "swapped-out placeholder (a 0-dim tensor), which zero_to_fp32 cannot concatenate; it is read from "
                  "its file (frozen_fragments.py)"),
    Rebinding(ENGINE, "load_module_state_dict", "loading_frozen_fragments_into_files", wraps=True,
              why="a load copies a frozen parameter's saved fragment into its ds_tensor: for a partition on NVMe the "
                  "placeholder, so the frozen weights were never loaded; the partition is read first and written "
                  "back after (frozen_fragments.py)"),
    Rebinding(ENGINE, "save_checkpoint", "linking_saved_swap_files", wraps=True,
              why="stock copies the whole optimizer swap folder (copytree) into every checkpoint: the files are "
                  "linked instead, and written once across file systems (checkpoint_save.py)"),
    Rebinding("deepspeed.runtime.zero.partition_parameters:Init", "_ensure_availability_of_partitioned_params",
              "restoring_kept_partitions", wraps=True,
              why="every gather runs it first and asserts that a partition away on NVMe belongs to a parameter "
                  "that is not gathered; the device tier keeps parameters gathered with their partition given "
                  "back, which an outside gather (GatheredParameters) then met: the partition is read back first "
                  "(coordinator.restoring_kept_partitions)"),
    Rebinding("deepspeed.runtime.zero.partition_parameters:Init", "_partition", "writing_owed_masters_first",
              wraps=True,
              why="with has_been_updated (GatheredParameters with a modifier rank, module.apply under zero.Init, "
                  "the compile fallback) it copies the gathered values into each partition in place: the fp32 "
                  "masters owed to their files from those partitions are written first "
                  "(master_write_behind.py)"),
    Rebinding("deepspeed.runtime.zero.partition_parameters:GatheredParameters", "__enter__",
              "gathering_after_owed_masters", wraps=True,
              why="at one rank on a host accelerator the gathered tensor is the partition itself, which code inside "
                  "the context may change in place before _partition runs: the fp32 masters owed to their files "
                  "from those partitions are written first (master_write_behind.py)"),
    Rebinding(STAGE3, "get_full_hp_param", "reading_full_state_before_release", wraps=True,
              why="safe_get_full_fp32_param / _optimizer_state: stage 3 releases the swapped-in sub-group before "
                  "it gathers from its view; the release waits until the getter is done (a streaming slot or held "
                  "buffer goes to another tensor at the next read). It reads the master or a state tensor, never "
                  "the gradient (_get_fp32_opt_state_partition): the sub-group is lent without it"),
    Rebinding(STAGE3, "get_fp32_grad_for_param", "reading_full_fragment_before_release", wraps=True,
              why="safe_get_full_grad: the same, for the sub-group's gradient"),
    Rebinding(STAGE3, "get_local_fp32_param", "copying_local_state_before_release", wraps=True,
              why="safe_get_local_fp32_param / _optimizer_state return a view of the released sub-group (on the "
                  "host): it is copied before the release; lent without its gradient, as get_full_hp_param"),
    Rebinding(STAGE3, "get_local_fp32_grad_for_param", "copying_local_fragment_before_release", wraps=True,
              why="safe_get_local_grad: the same, for the sub-group's gradient"),
    Rebinding(STAGE3, "set_full_hp_param", "giving_back_when_a_state_setter_raises", wraps=True,
              why="safe_set_full_fp32_param / _optimizer_state swap the sub-group in, write, and swap it out; one that "
                  "raises in between (a state key the optimizer lacks) gives it back unchanged, not lent for good; "
                  "lent without its gradient, which it does not touch"),
    Rebinding(STAGE3, "set_fp32_grad_for_param", "giving_back_when_a_setter_raises", wraps=True,
              why="safe_set_full_grad: the same (a sub-group with no gradient yet raises in between)"),
    Rebinding(STAGE3, "set_local_hp_param", "giving_back_when_a_local_state_setter_raises", wraps=True,
              why="safe_set_local_fp32_param / _optimizer_state: the same; and the value's size checked against the "
                  "parameter's partition, not its one-element placeholder while on file with our parameter swapper "
                  "(a value of the partition's size was refused, one element broadcast over it: install.py)"),
    Rebinding(STAGE3, "set_local_grad_for_param", "giving_back_when_a_local_setter_raises", wraps=True,
              why="safe_set_local_grad: the same"),
    Rebinding(STAGE3, "update_fp32_grad_for_param_vectorized", "keeping_gradients_written_when_an_update_raises",
              wraps=True,
              why="safe_update_full_grad_vectorized writes each parameter's gradient fragment between its sub-group's "
                  "swap-in and write-back: an update_func that raises part way (or no gradient yet) gives the "
                  "sub-group back with the fragments written so far, as stock CPU offload keeps them"),
    Rebinding(STAGE3, "get_hp_param_device", "reading_full_state_before_release", wraps=True,
              why="offload_states asks where a state lives: stage 3 swaps the sub-group in for it, so a state key the "
                  "optimizer lacks raises before the release, as in the getters; lent without its gradient"),
    Rebinding(STAGE3, "state_dict", "saving_beta_products", wraps=True,
              why="DeepSpeedCPUAdam's C++ beta products follow from the step they were last recomputed at (a "
                  "scheduler cycling the betas recomputes them every step), which no optimizer state records: the "
                  "ZeRO file keeps it beside stage 3's own keys, which stock's load reads by name "
                  "(adam_beta_products.py)"),
    Rebinding(STAGE3, "_rigid_load_state_dict", "rigid_load_with_params_on_file", wraps=True,
              why="stock's ZeRO-file load with parameters on file and the optimizer on cpu stops ('NoneType' object "
                  "has no attribute 'data'): the parameters are rebuilt from the loaded masters as a step does "
                  "(checkpoint.py)"),
    Rebinding(STAGE3, "_offload_grad_partition_at_boundary", "handing_gradients_uncast", wraps=True,
              why="stage 3 casts each reduced gradient partition of a swapped sub-group to fp32 before handing it to "
                  "the swapper, which reads stage 3's host copy instead: where it will, the cast (a new tensor the "
                  "size of every gradient, each step) is skipped (stage3_gradients.py)"),
    Rebinding(STAGE3, "_constant_buffered_norm2", "norming_in_reused_memory", wraps=True,
              why="stage 3 takes every gradient's norm over a fresh float64 copy of it, on a host accelerator a new "
                  "mapping whose pages fault in again at each norm (10 GB a backward on gpt2-1.3b): the copy goes "
                  "into one reused buffer, the operations unchanged (gradient_norms.py)"),
    Rebinding(STAGE3, "unscale_and_clip_grads", "noting_gradient_scales", wraps=True,
              why="the swapper is told the factor stage 3 scales each swapped sub-group's gradient by in place, "
                  "to replay it where stock CPU offload's buffer keeps the product (stage3_gradients.py)"),
    Rebinding(STAGE3, "_DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads", "marking_tencache_reductions",
              wraps=True,
              why="marks the reduce-scatter of each gradient bucket as one for a tencache optimizer on a host "
                  "accelerator (one_rank_reduce.py)"),
    Rebinding(STAGE3, "_DeepSpeedZeroOptimizer_Stage3__add_grad_to_ipg_bucket", "partitioning_each_gradient_at_once",
              wraps=True,
              why="where a gradient's reduce will be handed views, its copy into the contiguous bucket is a pass for "
                  "nothing that keeps the bucket's pages resident: it is reduced and partitioned at once, alone "
                  "(one_rank_reduce.py)"),
    Rebinding("deepspeed.runtime.zero.stage3", "reduce_scatter_coalesced", "reducing_without_copy_at_one_rank",
              wraps=True,
              why="__avg_scatter_grads calls it by this module-global name: at a group of one rank it copies the "
                  "bucket into a new buffer and reduces it onto itself; a marked call gets views of the gradients, "
                  "the same values (one_rank_reduce.py)"),
    Rebinding(STAGE3, "refresh_fp32_params", "refresh_masters_swapping_in", wraps=True,
              why="load_checkpoint(load_module_only=True) copies the loaded 16-bit weights into the fp32 masters in "
                  "place, which with the optimizer on NVMe are empty placeholders (it stopped): each sub-group is "
                  "swapped in, set and swapped out (checkpoint.py)"),
    Rebinding(STAGE3, "_restore_from_bit16_weights", "restoring_masters_from_files", wraps=True,
              why="a load without the optimizer's state (or of the module only) sets the fp32 masters from the flat "
                  "16-bit partitions, which parameters on file beyond max_in_cpu do not have (it stopped, "
                  "half-loaded): their partitions are read from file (checkpoint.py)"),
)

PRIVATE_MEMBERS = (
    # The one-rank reduce (one_rank_reduce.py)
    PrivateMember(STAGE3, "_get_param_partition_group", "method", "one_rank_reduce.py",
                  "the group a parameter's gradient is reduce-scattered over: of one rank, tencache hands views"),
    PrivateMember(STAGE3, "reduce_scatter", "attribute", "one_rank_reduce.py",
                  "off, stage 3 all-reduces its contiguous bucket and the reduce-scatter (and its views) is not used"),
    PrivateMember(STAGE3, "ipg_buckets", "attribute", "one_rank_reduce.py",
                  "the buckets by communication dtype: a gradient partitioned at once joins its bucket alone"),
    PrivateMember(STAGE3, "get_param_comm_dtype", "method", "one_rank_reduce.py", "which bucket a gradient joins"),
    PrivateMember(STAGE3, "dtype", "attribute", "one_rank_reduce.py",
                  "the model's dtype: __avg_scatter_grads casts a gradient to the communication dtype only where "
                  "that differs from it, so a gradient partitioned at once must be of the communication dtype then"),
    PrivateMember(STAGE3, "__reduce_and_partition_ipg_grads", "method", "one_rank_reduce.py",
                  "stage 3's own flush of a bucket (reduce, partition_grads, the gradient freed, the bucket reset), "
                  "called for a bucket of one gradient"),
    PrivateMember("deepspeed.runtime.zero.stage3:IPGBucketZ3", "params", "field", "one_rank_reduce.py",
                  "the bucket's parameters, which the flush reduces"),
    PrivateMember("deepspeed.runtime.zero.stage3:IPGBucketZ3", "elements", "field", "one_rank_reduce.py",
                  "the bucket's element count, which stage 3's own add keeps beside the parameters"),
    PrivateMember("deepspeed.runtime.zero.stage3:IPGBucketZ3", "process_group", "field", "one_rank_reduce.py",
                  "the bucket's partition group, which stage 3's own add sets"),
    # The coordinator subclass (coordinator.py)
    PrivateMember(COORDINATOR, "__release_param", "method", "coordinator.py",
                  "overridden by its mangled name: every release of a gathered parameter passes through it, so the "
                  "device tier decides there which parameters stay gathered; also called for the real release"),
    PrivateMember(COORDINATOR, "__inflight_param_registry", "attribute", "coordinator.py",
                  "release_for_optimizer_step waits for in-flight all-gathers before releasing, as "
                  "release_and_reset_all does"),
    PrivateMember(COORDINATOR, "__step_id", "attribute", "coordinator.py",
                  "the module step now running: the device tier's 'now' for next-use eviction"),
    PrivateMember(COORDINATOR, "__param_order", "attribute", "coordinator.py",
                  "the recorded trace: which parameter is used at which module step, the device tier's index"),
    PrivateMember(COORDINATOR, "__submodule_order", "attribute", "coordinator.py",
                  "the number of module steps in a training step (the index wraps around it)"),
    PrivateMember(COORDINATOR, "_invalidate_trace", "method", "coordinator.py",
                  "overridden: when the live sequence leaves the trace the device tier drops its prediction (and "
                  "keeps its residents: they are current until the optimizer step)"),
    PrivateMember(COORDINATOR, "__n_available_params", "attribute", "coordinator.py",
                  "stock's count of gathered numel, zeroed at every reset_step: set to the device tier's residents "
                  "there, so max_live_parameters still bounds its prefetch"),
    PrivateMember(COORDINATOR, "__allgather_stream", "attribute",
                  "coordinator.py (_give_back_partition), param_swapper.py (_device_copy_fence)",
                  "the H2D copies of partitions run on it; the fence argument relies on fetch_sub_module making the "
                  "current stream wait for it before a module runs, except where the device tier keeps a parameter "
                  "whose gather reset_step waited for on the current stream alone: its partition's fence is also "
                  "recorded on this stream; where __all_gather_params releases persisted parameters on NVMe right "
                  "after starting their gather (still INFLIGHT), the fence synchronises the device first"),
    # Stage 3 (install.py, checkpoint.py, coordinator.py, reporting.py)
    PrivateMember(STAGE3, "_set_fp32_optimizer_param_groups", "method", "checkpoint.py",
                  "puts the fp32 partitions into the torch optimizer's param groups, so saved Adam state pairs "
                  "with live parameters in torch's own order"),
    PrivateMember(STAGE3, "_clear_fp32_optimizer_param_groups", "method", "checkpoint.py",
                  "undoes _set_fp32_optimizer_param_groups"),
    PrivateMember(STAGE3, "reset_swap_buffers", "method", "checkpoint.py",
                  "reads adopted masters back and rebuilds the parameters from them, as the engine's load does"),
    PrivateMember(STAGE3, "_swap_in_sub_group_to_flat_buffer", "method", "checkpoint.py",
                  "a sub-group's 16-bit weights read from its parameters' partitions, on file or not, into a flat "
                  "fp32 buffer (how stage 3 builds the masters of parameters beyond max_in_cpu)"),
    PrivateMember(STAGE3, "_prepare_sub_group", "method", "checkpoint.py, zero_file.py",
                  "swaps a sub-group's master and optimizer state in (as step() does), so that a load can set them"),
    PrivateMember(STAGE3, "_release_sub_group", "method", "checkpoint.py, zero_file.py",
                  "swaps the sub-group's master and optimizer state out again after a load has set them"),
    PrivateMember(STAGE3, "fp16_partitioned_groups_flat_numel", "attribute",
                  "zero_file.py, universal.py, memory_pressure.py",
                  "each sub-group's size, which its master (an empty placeholder while swapped out) does not show"),
    PrivateMember(STAGE3, "ipg_buckets", "attribute", "memory_pressure.py",
                  "the gradient buckets by communication dtype (the dtypes whether or not contiguous_gradients "
                  "allocates their buffers), their buffers allocated at initialisation and untouched until the "
                  "first backward: the host governor's prior"),
    PrivateMember(STAGE3, "reduce_bucket_size", "attribute", "memory_pressure.py",
                  "the gradient bucket's elements, which a reduce copies twice: the host governor's prior"),
    PrivateMember(STAGE3, "master_weights_and_grads_dtype", "attribute", "universal.py",
                  "the masters' dtype (bf16 with bf16_master_weights_and_grads), which a swapped-out master's "
                  "placeholder, an empty fp32 tensor, does not show"),
    PrivateMember(STAGE3, "_load_global_state_stage3", "method", "universal.py",
                  "sets the loss scaler from a universal checkpoint's optimizer state, as stage 3's own load does"),
    PrivateMember(STAGE3, "load_hp_checkpoint_state", "method", "universal.py",
                  "this rank's partition of one parameter's fp32 weights or moments in a universal checkpoint"),
    PrivateMember(STAGE3, "param_names", "attribute", "universal.py",
                  "each parameter's name: its folder in a universal checkpoint"),
    PrivateMember(STAGE3, "_swappable_optimizer_subgroup", "method",
                  "checkpoint.py, stage3_gradients.py, saved_layout.py",
                  "tells the sub-groups too small to swap, whose masters a load restores from the ZeRO file, whose "
                  "gradients stage 3 does not hand the swapper, and which a checkpoint must not have swap files of"),
    PrivateMember(STAGE3, "_reassign_or_swap_out_partitioned_parameters", "method", "checkpoint.py",
                  "rebuilds a sub-group's parameters from its master, as a step does"),
    PrivateMember(STAGE3, "fp16_partitioned_groups_flat", "attribute", "checkpoint.py, master_copies.py",
                  "each sub-group's flat 16-bit partition (None where the parameters are on file beyond max_in_cpu): "
                  "what load_module_only sets the masters from"),
    PrivateMember(STAGE3, "persistent_parameters", "attribute", "checkpoint.py",
                  "the parameters kept whole on every rank: released before checkpoint_event_epilogue gathers them "
                  "again from partitions rebuilt after the engine's load"),
    PrivateMember(STAGE3, "checkpoint_event_epilogue", "method", "checkpoint.py",
                  "the end of the engine's load: gathers the persistent parameters (and the secondary tensors)"),
    PrivateMember(STAGE3, "optimizer_swapper", "attribute", "install.py, checkpoint.py, reporting.py, stats.py",
                  "the optimizer swapper the ZeRO-3 optimizer built: closed, reported and checkpointed through it"),
    PrivateMember(STAGE3, "parameter_offload", "attribute", "install.py, coordinator.py",
                  "holds the module and its parameter coordinator (get_param_coordinator)"),
    PrivateMember(STAGE3, "fp16_groups", "attribute",
                  "reporting.py, stage3_gradients.py, memory_pressure.py, master_copies.py",
                  "the partitioned parameters, through which their swappers are found, by sub-group"),
    PrivateMember(STAGE3, "fp16_partitioned_groups", "attribute", "master_copies.py",
                  "each sub-group's parameter partitions in its master's order (_partitioned_params_swap_out's): "
                  "what an fp32 master is filled from"),
    PrivateMember(STAGE3, "__param_id_to_grad_partition", "attribute", "stage3_gradients.py",
                  "each parameter's view of the host gradient buffer: the copy of a gradient fragment the update "
                  "reads instead of storing the fragment"),
    PrivateMember(STAGE3, "grad_partitions_flat_buffer", "attribute", "stage3_gradients.py",
                  "the gradient buffer those views share: looked up only where it is host memory"),
    PrivateMember(STAGE3, "grad_position", "attribute", "stage3_gradients.py",
                  "a parameter's sub-group and offset: where swap_out_gradients hands its fragment"),
    PrivateMember(STAGE3, "_offload_boundary_param_ids", "attribute", "stage3_gradients.py",
                  "the parameters reduced in the current window (a new set at each step): a remembered gradient "
                  "fragment read at an update where stage 3 changed it without handing it is counted and warned of"),
    PrivateMember(STAGE3, "get_param_id", "method", "stage3_gradients.py",
                  "the key of grad_position (undocumented)"),
    PrivateMember(STAGE3, "norm_for_param_grads", "attribute", "stage3_gradients.py",
                  "each parameter's gradient norm, which _offload_grad_partition_at_boundary records; its wrapper "
                  "records it too where it hands the partition uncast"),
    PrivateMember(STAGE3, "_constant_buffered_norm2", "method", "stage3_gradients.py",
                  "the norm stage 3 records for clipping, computed as stage 3 computes it"),
    PrivateMember(STAGE3, "fp32_partitioned_groups_flat", "attribute", "stage3_gradients.py, master_copies.py",
                  "each sub-group's fp32 partition, whose id names the sub-group in swap_out_gradients, and whose "
                  "gradient is the only thing unscale_and_clip_grads changes (its probe stands in for it)"),
    # The engine (checkpoint.py, checkpoint_save.py, saved_layout.py, universal.py)
    PrivateMember(ENGINE, "load_universal_checkpoint", "method", "saved_layout.py, install.py",
                  "whether the load is of a universal checkpoint (config checkpoint.load_universal), which the NVMe "
                  "load path skips and after which Adam's beta products are not replayed"),
    PrivateMember(ENGINE, "micro_steps", "attribute", "install.py",
                  "micro-batches stepped so far: with gradient_accumulation_steps, how far into its window a forward "
                  "pass is, which the memory-pressure stop's message tells (a checkpoint saved then lacks the window's "
                  "gradients)"),
    PrivateMember(ENGINE, "managed_gradient_accumulation", "method", "install.py",
                  "... only where DeepSpeed counts the window itself"),
    PrivateMember(ENGINE, "_is_gradient_accumulation_boundary", "attribute", "install.py",
                  "... and the user set no boundary by hand (set_gradient_accumulation_boundary)"),
    PrivateMember(ENGINE, "zero_load_from_fp32_weights", "method", "universal.py",
                  "whether a load without the optimizer's state sets the masters from the checkpoint's fp32 weights"),
    PrivateMember(ENGINE, "_checkpoint_tag_validation", "method", "checkpoint_save.py",
                  "the ranks' agreement on a save's tag (tag_validation FAIL), asked before a save removes this "
                  "rank's swap files of an earlier save into the tag: refused after, it had destroyed that checkpoint"),
    PrivateMember(ENGINE, "checkpoint_tag_validation_fail", "method", "checkpoint_save.py",
                  "whether a disagreement on the tag stops the save (then asked first)"),
    PrivateMember(ENGINE, "_get_zero_ckpt_name", "method", "checkpoint.py, checkpoint_save.py",
                  "the ZeRO checkpoint file of this rank, whose optimizer state stock's NVMe load skips, and whose "
                  "folder decides whether the masters can share the swap files' blocks"),
    PrivateMember(TORCH_CHECKPOINT_ENGINE, "zipfile_serialization", "attribute", "checkpoint_save.py",
                  "the ZeRO file is a zip (torch.save's default): only then can its masters share blocks"),
    # The optimizer swapper base class (optimizer_swapper.py)
    PrivateMember(OPTIMIZER_SWAPPER, "_get_param_swap_info", "method", "optimizer_swapper.py",
                  "registers a sub-group's state tensors the step just created (stock bookkeeping kept as is)"),
    PrivateMember(OPTIMIZER_SWAPPER, "_get_swap_paths", "method", "optimizer_swapper.py",
                  "stock's swap file names, kept so checkpoints copy the folder file by file"),
    PrivateMember(OPTIMIZER_SWAPPER, "_update_param_state_info", "method", "optimizer_swapper.py",
                  "stock's record of a sub-group's state tensors"),
    PrivateMember(OPTIMIZER_SWAPPER, "swap_params_info", "attribute", "optimizer_swapper.py, checkpoint.py",
                  "sub-group id -> OptimizerStateSwapInfo, read by stage 3 and by checkpoint adoption"),
    # The stock swappers, for reporting what stock would lock (stats.py)
    PrivateMember(PARAM_SWAPPER, "buffers", "attribute", "stats.py", "stock's pinned parameter slots"),
    PrivateMember(PARAM_SWAPPER, "partitioned_swap_buffer", "attribute", "stats.py",
                  "stock's pinned write-back staging buffer"),
    PrivateMember(PARTITIONED_OPTIMIZER_SWAPPER, "swap_buffer_manager", "attribute", "stats.py",
                  "stock's pinned optimizer buffers (all_buffers)"),
    # DeepSpeed's config object (config_source.py)
    PrivateMember(DS_CONFIG, "_param_dict", "attribute", "config_source.py",
                  "the user's raw dict: DeepSpeed's parsed sections drop the top-level \"tencache\" block"),
)

CALL_ORDER = (
    CallOrder("stage 3 changes a swapped sub-group's lent gradient in place only in unscale_and_clip_grads, once per "
              "step that updates the sub-group, after the swap-in that lends it (a GradScaler's unscale, "
              "torch_autocast in fp16 on a GPU, changes it too and is not replayed)",
              "stage3_gradients.py (noting_gradient_scales) -> cache/gradient_fragments.py",
              "a fragment not handed again is filled with the factors noted; another in-place change would be "
              "missing from it, and its update would differ from stock CPU offload's",
              "tests/deepspeed/test_zero_scenarios.py (varying_accumulation), tests/deepspeed/test_tensor_fragments.py "
              "(get_: the gradients after the step), tests/integrations/test_gradient_scales.py"),
    CallOrder("stage 3 reads a gradient added to a bucket only in that bucket's flush, and with reduce_scatter on "
              "each parameter's grad there, not the bucket's buffer; partition_grads copies or adds each gradient's "
              "partition on its own; __avg_scatter_grads casts to the communication dtype where it is not the "
              "model's",
              "one_rank_reduce.py (partitioning_each_gradient_at_once)",
              "a gradient of a group of one or two ranks is partitioned at once, without the bucket's copy: were the "
              "buffer read, or one gradient's partition made from another's, the values would differ",
              "tests/deepspeed/test_parity.py (bit-identical losses and weights, gradients_partitioned_at_once > 0), "
              "tests/deepspeed/test_residency.py (two ranks, an odd split: stock CPU offload's bits, "
              "gradients_partitioned_at_once > 0), tests/deepspeed/test_zero_scenarios.py"),
    CallOrder("stage 3 only reads the partitions __avg_scatter_grads returns (scaled or cast into new tensors, "
              "copied or added into its gradient partitions by partition_grads), and does so before the reduced "
              "bucket's gradients are written again (the bucket is reset only after partition_grads)",
              "one_rank_reduce.py",
              "at one rank a tencache optimizer's reduce returns views of the bucket's gradients, not a copy: a "
              "later write to either would change the other",
              "tests/deepspeed/test_parity.py (bit-identical losses and weights, gradient_reductions_without_copy "
              "> 0), tests/deepspeed/test_one_rank_reduce.py"),
    CallOrder("each gradient's hook calls reduce_ready_partitions_and_remove_grads through the instance, inside "
              "the backward, after pre_backward and before step(): once per parameter gradient produced",
              "install.py (reading_ahead_between_gradients) -> optimizer_swapper.gradient_reduced",
              "the first sub-group's state still being written behind when the backward begins is read once written "
              "(cache/optimizer_reads_ahead.py); not called means it is read in the update again, silently",
              "tests/deepspeed/test_residency.py::test_one_sub_group_streaming_is_read_ahead_in_every_backward"),
    CallOrder("stage 3's step() calls _post_step exactly once per optimizer step that updates the weights, after "
              "the update (a step skipped for gradient overflow returns before it)",
              "install.py -> reporting.on_optimizer_step_end",
              "ends the step: write-backs, the governor, the metrics record; not called means no write-back and no "
              "metrics, silently", "tests/deepspeed/test_device_tier_engine.py (one metrics line per step)"),
    CallOrder("stage 3's step() is entered once per optimizer step (one skipped for gradient overflow too), after "
              "the step's last backward and before its update", "install.py (marking_step) -> "
              "memory_pressure.HostTierGovernor.before_update",
              "the host governor's rise meter takes a boundary between the backward and the update, so a backward's "
              "peak is measured against the level before it, not the higher level an update leaves",
              "tests/integrations/test_step_boundary.py, tests/deepspeed/test_memory_pressure_engine.py "
              "(host_rise_boundaries: two per optimizer step)"),
    CallOrder("stage 3 calls _partitioned_params_swap_out(i) between the swap-in and the swap-out of sub-group "
              "i's optimizer state (step, initialize_optimizer_states, reset_swap_buffers, loads), after the last "
              "change to its master", "install.py (noting_master_copies) -> master_copies.py",
              "the copy is noted while the master is lent, so the partitions are known to hold the master it is "
              "given back with; a master changed outside that pattern (safe_set_full_fp32_param) is read from file",
              "tests/deepspeed/test_master_copies.py (bit-identical losses and weights)"),
    CallOrder("stage 3's step() calls _partition_all_parameters before it writes the new weights into each "
              "resident partition in place (_partitioned_params_swap_out)", "install.py, coordinator.py",
              "a kept parameter whose gathered tensor is its partition is current after the step without a "
              "re-fetch", "tests/deepspeed/test_device_tier_engine.py (bit-identical losses)"),
    CallOrder("DeepSpeedZeroOptimizer_Stage3.__init__ builds the optimizer swapper (_configure_tensor_swapping) "
              "with no config argument", "config_bridge.building_stage3, optimizer_swapper.py",
              "the config is named by the __init__ wrapper; without it the swapper cannot tell a tencache config "
              "and refuses to build", "tests/deepspeed/test_parity.py"),
    CallOrder("the optimizer swapper's log_timers() is called once at the end of initialisation and once per "
              "optimizer step (from _post_step, or before step() returns on overflow)",
              "optimizer_swapper.py (profile lifecycle, gradient windows)",
              "it counts steps to know when the profiled training step ends, and ends the accumulation window of "
              "the gradient fragments (after step() began with _pre_step, which starts stage 3's new set of "
              "reduced parameters)", "tests/deepspeed/test_parity.py, test_residency.py (skipped branch)"),
    CallOrder("every rank calls engine.forward (and so the host governor, which runs the device tier's budget "
              "agreement and the stop vote: two all-reduces) the same number of times, in the same order",
              "memory_pressure.py, agreement.py",
              "data-parallel training does; a forward on one rank only would hang in ZeRO-3's all-gathers anyway",
              "tests/deepspeed/test_rank_agreement.py"),
    CallOrder("every rank's engine.load_checkpoint with the optimizer on NVMe copies its own checkpoint folder "
              "over its swap folder (shutil.copytree) once per load, at the same point",
              "saved_layout.py (the refusals at the copy, agreed over the ranks: one all-reduce)",
              "a rank that skipped the copy would leave the others waiting in the agreement (an all-reduce over the "
              "whole world, as agreement.py's others: engines on disjoint sets of ranks in one world are not "
              "supported)",
              "tests/deepspeed/test_exact_resume.py (a checkpoint that lost moment files, 2 ranks)"),
    CallOrder("the engine reads the optimizer swapper's swap_folder just before it copies the folder into a "
              "checkpoint (save) or over it (load)", "optimizer_swapper.py (swap_folder property)",
              "held changed state is flushed to its files exactly then", "tests/deepspeed/test_parity.py (resume)"),
    CallOrder("the coordinator records a complete trace in the first step and reset_step() ends each step",
              "coordinator.py", "the device tier's index is built from the complete trace at reset_step",
              "tests/deepspeed/test_device_tier_engine.py"),
    CallOrder("engine.forward() runs before any parameter of its step is fetched", "install.py (governor)",
              "the host tier is refitted between steps, never while a step holds lent buffers",
              "tests/deepspeed/test_memory_pressure_engine.py"),
    CallOrder("at the accumulation boundary partition_grads hands swap_out_gradients, per parameter, the first "
              "elements of its view of the host gradient buffer (a device copy on a GPU; cast to fp32 by stock's "
              "_offload_grad_partition_at_boundary, uncast by its wrapper where the view is found), which stage "
              "3 writes again only when it reduces that parameter again; on a GPU it fills the view on "
              "reduce_and_partition_stream, which the backward's epilogue synchronises before step() can run",
              "stage3_gradients.py, optimizer_gradients.py (handed, lend)",
              "the update reads each fragment's values from that view instead of a stored copy",
              "tests/deepspeed/test_residency.py (bf16 and fp32, stock's bits, no gradient file)"),
    CallOrder("stage 3's fragment getters release a swapped-in sub-group through release_swap_buffers (never "
              "with its state changed) before they read the view they gather from or return",
              "install.py (_fragment_call_within_releases_deferred), optimizer_swapper.py (releases_deferred)",
              "those releases are deferred until the getter returns, so the view still holds the sub-group's bytes "
              "when it is read", "tests/deepspeed/test_tensor_fragments.py (nothing held: stock CPU offload's "
              "values)"),
    CallOrder("_save_zero_checkpoint writes the rank's ZeRO file with one checkpoint_engine.save(state, path) call",
              "checkpoint_save.py (saving_masters)",
              "that call is the one whose masters share the swap files' blocks, where the file system clones",
              "tests/deepspeed/test_zero_to_fp32.py (the file system that clones)"),
)


def require_supported_deepspeed() -> None:
    """Raise TencacheConfigError when the installed DeepSpeed is not a supported version (a config that enables
    tencache asks for something this DeepSpeed cannot give)."""
    import deepspeed
    problem = version_problem(deepspeed.__version__)
    if problem is not None:
        raise TencacheConfigError(problem)


def resolve(owner: str):
    """The module or class named "module" / "module:Class"."""
    module_name, _, class_name = owner.partition(":")
    target = importlib.import_module(module_name)
    return getattr(target, class_name) if class_name else target


def _assigns_attribute(cls, name: str) -> bool:
    """Whether DeepSpeed's source of ``cls`` (or a DeepSpeed base class) assigns ``self.<name>``: instance
    attributes exist only on instances, so the source is what can be checked without building one."""
    pattern = re.compile(r"self\." + re.escape(name) + r"\s*(?::[^=\n]+)?=(?!=)")
    for klass in inspect.getmro(cls):
        if not klass.__module__.startswith("deepspeed"):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if pattern.search(source):
            return True
    return False


def missing_from_deepspeed() -> List[str]:
    """Every rebinding target and private member of the tables above that the installed DeepSpeed lacks, as
    "owner.name" strings (empty: the contract holds)."""
    missing = []
    for entry in REBINDINGS:
        try:
            owner = resolve(entry.owner)
        except (ImportError, AttributeError):
            missing.append(f"{entry.owner} (owner of {entry.name})")
            continue
        # the original, also while installed: vars() of a class, or the module's own attribute
        if not hasattr(owner, entry.name):
            missing.append(f"{entry.owner}.{entry.name}")
    for member in PRIVATE_MEMBERS:
        try:
            owner = resolve(member.owner)
        except (ImportError, AttributeError):
            missing.append(f"{member.owner} (owner of {member.name})")
            continue
        if member.kind == "method":
            found = callable(getattr(owner, member.attribute, None))
        elif member.kind == "field":
            found = dataclasses.is_dataclass(owner) and \
                member.name in {field.name for field in dataclasses.fields(owner)}
        else:
            found = _assigns_attribute(owner, member.name)
        if not found:
            missing.append(f"{member.owner}.{member.name}")
    return missing


__all__ = ["Rebinding", "PrivateMember", "CallOrder", "REBINDINGS", "PRIVATE_MEMBERS", "CALL_ORDER",
           "SUPPORTED_SERIES", "TESTED_VERSION", "version_problem", "require_supported_deepspeed",
           "missing_from_deepspeed", "resolve"]
