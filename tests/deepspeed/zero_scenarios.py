"""Our versions of scenarios from DeepSpeed's ZeRO-3 tests, with the optimizer (and, with ``nvme+params``, the
parameters) offloaded (our code, written after tests/unit/v1/zero/test_zero.py in DeepSpeed's repository:
TestZeroUnbalancedGradients, TestZero3RepeatForwardLoop, TestZeroAdamOptimizerStepCount,
TestZero3ParamPartitioningBase, TestZeroPartitionCache, TestEmptyParameterGroup; test_zero_context.py's
test_ext_param_getattr and TestGatherUpdate; test_unwrap_model.py; and test_zero_user_backward.py's frozen-parameter
checkpointing tests; ZeRO-3, 2 ranks, bf16 instead of fp16, the
CPU accelerator, layers of 1024 so that the optimizer state is large enough to be swapped). They are what users do
besides the plain step: parameters that take turns receiving gradients, one layer applied several times in a
forward, several sub-groups whose Adam step counts must agree, several backward passes before one step, the
partition cache emptied after an evaluation, an empty parameter group, a weight used outside its module, a weight
one rank changes between steps, an update skipped for gradients that are not finite, stage 3's gradient-path knobs,
DeepSpeed's Muon, the whole model unwrapped for generation between steps, LoRA with gradient checkpointing, a
forward stopped by an error the loop catches, accumulation windows of varying length, PyTorch-style backward (three
engines' losses in one), a model built in nested ``zero.Init`` contexts, and a run whose step changes under it
(``torch_autocast``, leaf modules, the batch size changed mid-run).
Rank 0 prints one RESULT line.

    deepspeed --num_gpus 2 tests/deepspeed/zero_scenarios.py SCENARIOS stock|tencache[=BUDGETS] DEVICE NVME_DIR

SCENARIOS: comma-separated names of ``SCENARIOS`` below. DEVICE: ``cpu`` (stock CPU offload, the reference),
``nvme`` (the optimizer on NVMe) or ``nvme+params`` (the parameters too). ``tencache=BUDGETS``: comma-separated
values of the block's ``host_cache_bytes``, each running every scenario (its results under "SCENARIO@BUDGET").
A scenario's result holds SHA-256 sums of the losses, of what the calls returned and of the weights training
ends with, so that runs compare bit for bit, and the checks the upstream test makes.
"""
import contextlib
import functools
import glob
import os
import sys

import torch
import torch.utils.checkpoint

from scenarios import digest, gathered, run_scenarios  # tests/deepspeed/scenarios.py

ARGS = [arg for arg in sys.argv[1:] if not arg.startswith("--local_rank")]  # the launcher adds --local_rank=N
if ARGS[1].startswith("tencache"):
    import tencache_ds  # noqa: F401  (installs the swappers; DeepSpeed is imported already where forked)
import deepspeed  # noqa: E402
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus  # noqa: E402
from deepspeed.utils import safe_get_local_grad  # noqa: E402

HIDDEN = 1024


def ds_config(budget, device, nvme, gas=1, **zero):
    offload = {"device": "cpu" if device == "cpu" else "nvme", "pin_memory": False}
    if device != "cpu":
        offload.update(nvme_path=nvme, buffer_count=4)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas, "steps_per_print": 1000000,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "offload_optimizer": offload, **zero},
              "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                      "overlap_events": True}}
    if device == "nvme+params":
        config["zero_optimization"]["offload_param"] = dict(offload, buffer_count=8, buffer_size=2_000_000)
    if budget is not None:  # tencache's
        config["tencache"] = {"host_cache_bytes": budget}
    return config


class Layers(torch.nn.Module):
    """Square linear layers; with ``repeat``, the middle one applied that many times (test_zero.py's
    AlbertLikeModel: a stack of forwards of one layer, then a stack of its backwards)."""

    def __init__(self, layers=3, repeat=1):
        super().__init__()
        self.ll = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(layers))
        self.repeat = repeat
        self.cross_entropy_loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, y):
        for index, layer in enumerate(self.ll):
            for _ in range(self.repeat if index == 1 else 1):
                x = x + torch.relu(layer(x))
        return self.cross_entropy_loss(x.float(), y)


def batches(count):
    generator = torch.Generator().manual_seed(7 + torch.distributed.get_rank())
    for _ in range(count):
        yield (torch.randn(2, HIDDEN, generator=generator).to(torch.bfloat16),
               torch.randint(0, HIDDEN, (2,), generator=generator))


@contextlib.contextmanager
def engine_for(config, model_factory=Layers, param_groups=None, client_optimizer=None, zero_init=True):
    """A fresh engine for one scenario, destroyed at the end (ZeRO-3 leaks its hooks otherwise); its model built
    under ``zero.Init``, or (``zero_init`` false) whole and converted by ``deepspeed.initialize``."""
    torch.manual_seed(1234)
    with deepspeed.zero.Init(config_dict_or_path=config) if zero_init else contextlib.nullcontext():
        model = model_factory()
    parameters = param_groups(model) if param_groups else model.parameters()
    optimizer = client_optimizer(parameters) if client_optimizer else None
    engine, *_ = deepspeed.initialize(config=config, model=model, optimizer=optimizer,
                                      model_parameters=model.parameters() if optimizer else parameters)
    try:
        yield engine
    finally:
        engine.destroy()


def trained(engine, data):
    """Forward, backward and step for each batch of ``data``; the losses."""
    losses = []
    for x, y in data:
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss)
    return losses


def losses_and_weights(engine, losses):
    return {"losses": digest({f"{i:03d}": loss for i, loss in enumerate(losses)}),
            "weights": digest(gathered(engine))}


def unbalanced(budget, device, nvme):
    """TestZeroUnbalancedGradients: at every micro-batch half the parameters take no gradient (odd and even ones
    in turn), gradient accumulation 2, all of them trainable again after each step."""
    with engine_for(ds_config(budget, device, nvme, gas=2)) as engine:
        losses = []
        for micro, (x, y) in enumerate(batches(8)):
            odd = (micro + 1) % 2
            for index, param in enumerate(engine.module.parameters()):
                param.requires_grad = (index % 2) == odd
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            losses.append(loss)
            for param in engine.module.parameters():
                param.requires_grad = True
        return losses_and_weights(engine, losses)


def repeat(budget, device, nvme):
    """TestZero3RepeatForwardLoop: one layer applied three times in each forward, gradient accumulation 2."""
    with engine_for(ds_config(budget, device, nvme, gas=2), functools.partial(Layers, repeat=3)) as engine:
        return losses_and_weights(engine, trained(engine, batches(6)))


def step_count(budget, device, nvme):
    """TestZeroAdamOptimizerStepCount: several sub-groups (``sub_group_size`` one layer's weight), gradient
    accumulation 2; after every optimizer step all sub-groups' Adam step counts agree with the engine's."""
    config = ds_config(budget, device, nvme, gas=2, sub_group_size=HIDDEN * HIDDEN)
    with engine_for(config, functools.partial(Layers, layers=4)) as engine:
        optimizer = engine.optimizer
        agree, losses, groups = engine.global_steps == 0, [], len(optimizer.fp16_groups)
        for x, y in batches(6):
            loss = engine(x, y)
            engine.backward(loss)
            boundary = engine.is_gradient_accumulation_boundary()
            engine.step()
            losses.append(loss)
            if boundary:
                counts = [int(optimizer.optimizer.state[optimizer.fp32_partitioned_groups_flat[group]]["step"])
                          for group in range(groups)]
                agree &= all(count == engine.global_steps for count in counts)
        return {**losses_and_weights(engine, losses), "agree": bool(agree), "several_sub_groups": groups > 2}


def backward_thrice(budget, device, nvme, partitions_getter=False):
    """TestZero3ParamPartitioningBase: three backward passes and no step between them (the gradients add up),
    this rank's gradients read after each (``safe_get_local_grad``; with ``partitions_getter``, the upstream
    test's ``get_fp32_grad_partitions``), then the optimizer's own ``step()``; every parameter is partitioned
    afterwards. Once with ``zero_grad`` after each backward (the gradients start over), once without."""
    seen = {}
    for zero_grad in (False, True):
        with engine_for(ds_config(budget, device, nvme)) as engine:
            grads = {}
            for micro, (x, y) in enumerate(batches(3)):
                engine.backward(engine(x, y))
                if partitions_getter:
                    for group, partitions in engine.optimizer.get_fp32_grad_partitions().items():
                        for index, grad in partitions.items():
                            grads[f"{micro}.{group}.{index}"] = grad.clone()
                else:  # a copy: under stock the getter's value is a view that the next backward changes
                    for name, param in engine.module.named_parameters():
                        grads[f"{micro}.{name}"] = safe_get_local_grad(param).clone()
                if zero_grad:
                    engine.optimizer.zero_grad()
            engine.optimizer.step()
            partitioned = all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in engine.module.parameters())
            seen[f"zero_grad={zero_grad}"] = {"grads": digest(grads), "partitioned": partitioned,
                                              "weights": digest(gathered(engine))}
    return seen


def empty_cache(budget, device, nvme):
    """TestZeroPartitionCache, after an evaluation pass: train, evaluate, ``empty_partition_cache()`` (every
    parameter's local data empty afterwards), train on; the step after gives stock's bits."""
    with engine_for(ds_config(budget, device, nvme)) as engine:
        data = list(batches(5))
        losses = trained(engine, data[:2])
        engine.eval()
        with torch.no_grad():
            losses.append(engine(*data[2]))
        engine.train()
        engine.empty_partition_cache()
        emptied = sum(p.numel() for p in engine.module.parameters()) == 0
        losses += trained(engine, data[3:])
        return {**losses_and_weights(engine, losses), "emptied": emptied}


def empty_group(budget, device, nvme):
    """TestEmptyParameterGroup, trained: two parameter groups (weights with weight decay, biases without), one
    of them empty, for DeepSpeed's optimizer and for a client's torch AdamW."""
    seen = {}
    for client in (False, True):
        for empty in ("weights", "biases"):
            def groups(model, empty=empty):
                weights = [layer.weight for layer in model.ll]
                biases = [layer.bias for layer in model.ll]
                return [{"params": [] if empty == "weights" else weights, "weight_decay": 0.01},
                        {"params": [] if empty == "biases" else biases, "weight_decay": 0.0}]
            config = ds_config(budget, device, nvme)
            if client:
                config.pop("optimizer")
                config["zero_allow_untested_optimizer"] = True
                config["zero_force_ds_cpu_optimizer"] = False
            with engine_for(config, param_groups=groups,
                            client_optimizer=(lambda g: torch.optim.AdamW(g, lr=0.1)) if client else None) as engine:
                seen[f"client={client},empty={empty}"] = losses_and_weights(engine, trained(engine, batches(3)))
    return seen


class SharedWeight(Layers):
    """test_zero_context.py's ExtLinear: the first layer's weight used again outside its module, by the parent's
    forward (ZeRO-3 registers it as an external parameter of the parent)."""

    def forward(self, x, y):
        hidden = super().forward(x, y)
        again = torch.nn.functional.linear(x, self.ll[0].weight)
        return hidden + again.float().pow(2).mean()


def external(budget, device, nvme):
    """TestSerialContext.test_ext_param_getattr, trained: a weight used outside its module every step."""
    with engine_for(ds_config(budget, device, nvme), SharedWeight) as engine:
        return losses_and_weights(engine, trained(engine, batches(4)))


def modified(budget, device, nvme):
    """TestGatherUpdate, between steps: after a step and an evaluation pass, rank 1 changes a weight inside
    ``GatheredParameters(modifier_rank=1)``; every rank then sees the change in a gather and in the next forward,
    and training goes on."""
    with engine_for(ds_config(budget, device, nvme)) as engine:
        losses, data = [], list(batches(4))
        for index, (x, y) in enumerate(data):
            if index == 2:
                engine.eval()
                with torch.no_grad():
                    losses.append(engine(x, y))
                engine.train()
                weight = engine.module.ll[1].weight
                with deepspeed.zero.GatheredParameters(weight, modifier_rank=1):
                    if torch.distributed.get_rank() == 1:
                        with torch.no_grad():
                            weight.mul_(0.5)
                with deepspeed.zero.GatheredParameters(weight):
                    seen_changed = digest({"weight": weight})
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            losses.append(loss)
        return {**losses_and_weights(engine, losses), "changed": seen_changed}


def other_optimizers(budget, device, nvme):
    """The optimizers besides Adam that ZeRO-Offload runs on the CPU (DeepSpeedCPUAdagrad for "Adagrad", one state
    tensor per sub-group; DeepSpeedCPULion for "Lion", another one), trained with two sub-groups a rank, gradient
    accumulation 2 and gradient clipping (after the upstream tests of ops/adagrad and ops/lion, trained here)."""
    seen = {}
    for name in ("Adagrad", "Lion"):
        config = ds_config(budget, device, nvme, gas=2, sub_group_size=HIDDEN * HIDDEN)
        config.update(optimizer={"type": name, "params": {"lr": 1e-3}}, gradient_clipping=1.0)
        with engine_for(config) as engine:
            seen[name] = {**losses_and_weights(engine, trained(engine, batches(6))),
                          "optimizer": type(engine.optimizer.optimizer).__name__}
    return seen


def saved_optimizer_state(checkpoint):
    """What this rank's ZeRO file of the latest checkpoint in ``checkpoint`` says of each optimizer state tensor: its
    key, dtype and size (a tensor with the optimizer on cpu, a meta tensor for one on NVMe: tencache's save
    describes those, so that they convert for a load on cpu: `tencache-ds checkpoint-for-cpu`)."""
    with open(os.path.join(checkpoint, "latest")) as handle:
        tag = handle.read().strip()
    [path] = glob.glob(os.path.join(checkpoint, tag, f"*zero_pp_rank_{torch.distributed.get_rank()}_*optim_states.pt"))
    saved = torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]["optimizer_state_dict"]
    return sorted(f"{key} {value.dtype} {value.numel()}" for state in saved["state"].values()
                  for key, value in state.items() if torch.is_tensor(value) and value.dim() > 0)


def muon(budget, device, nvme):
    """DeepSpeed's Muon ("type": "Muon", DeepSpeed 0.18+): the layers' weights orthogonalised by Muon (per head),
    whose one state tensor (``momentum_buffer``, in the communication dtype: bf16 beside fp32 masters) is swapped
    with the sub-group, the biases stepped by CPU Adam; Muon needs ``reduce_scatter`` off. Two sub-groups a rank,
    gradient accumulation 2; then a checkpoint, rolled back to in the same engine and loaded by a new one."""
    config = ds_config(budget, device, nvme, gas=2, sub_group_size=HIDDEN * HIDDEN, reduce_scatter=False)
    config["optimizer"] = {"type": "Muon", "params": {"lr": 1e-3}}

    def per_head(engine):
        """Orthogonalise the weights per head, 16 of 64 rows: Newton-Schulz over the whole 1024 x 1024 matrix runs
        on every rank (a launch of this scenario alone took 38 s, 32 per head, on 2 cores); the tensors swapped are
        the same either way.
        Set after ``deepspeed.initialize``, whose ``set_optimizer_flags`` tags every parameter (``use_muon`` from
        its shape; ``muon_num_heads`` only for a Hugging Face model with ``per_head_muon``); stage 3 reads the tag
        at each update. Returns the tags set, for the result."""
        for param in engine.module.parameters():
            param.muon_num_heads = 16 if param.use_muon else None
        return sorted({str(param.muon_num_heads) for param in engine.module.parameters()})

    data, checkpoint = list(batches(10)), os.path.join(nvme, "checkpoint")
    with engine_for(config) as engine:
        heads = per_head(engine)
        result = dict(losses_and_weights(engine, trained(engine, data[:6])), heads=heads,
                      optimizer=type(engine.optimizer.optimizer).__name__)
        # a checkpoint, two more steps, then back to the checkpoint and the same two steps again
        engine.save_checkpoint(checkpoint)
        result["saved_state"] = saved_optimizer_state(checkpoint)
        after = losses_and_weights(engine, trained(engine, data[6:]))
        engine.load_checkpoint(checkpoint)
        again = losses_and_weights(engine, trained(engine, data[6:]))
    with engine_for(config) as engine:  # and from the checkpoint in a new engine
        per_head(engine)
        engine.load_checkpoint(checkpoint)
        fresh = losses_and_weights(engine, trained(engine, data[6:]))
    # a checkpoint of stock DeepSpeed's swappers (tencache off: stock NVMe, which writes the momentum widened to
    # fp32), resumed by this run's engine
    stock_config = ds_config(None, device, os.path.join(nvme, "stock-swappers"), gas=2,
                             sub_group_size=HIDDEN * HIDDEN, reduce_scatter=False)
    stock_config.update(optimizer=config["optimizer"], **({"tencache": {"enabled": False}} if budget else {}))
    with engine_for(stock_config) as engine:
        per_head(engine)
        swappers = type(getattr(engine.optimizer, "optimizer_swapper", None)).__name__
        trained(engine, data[:6])
        engine.save_checkpoint(os.path.join(nvme, "stock-checkpoint"))
    with engine_for(config) as engine:
        per_head(engine)
        engine.load_checkpoint(os.path.join(nvme, "stock-checkpoint"))
        from_stock = losses_and_weights(engine, trained(engine, data[6:]))
    return dict(result, after_save=after, rolled_back_exactly=again == after, resumed_exactly=fresh == after,
                resumed_from_stocks_exactly=from_stock == after,
                stocks_saved=swappers in ("NoneType", "PartitionedOptimizerSwapper", "PipelinedOptimizerSwapper"))


def inference(budget, device, nvme):
    """ZeRO-Inference (DeepSpeed's tutorial): the parameters offloaded, no optimizer at all, forward passes under
    ``no_grad`` in eval mode, each batch twice (the second time after others went through)."""
    config = ds_config(budget, device, nvme)
    del config["optimizer"]
    del config["zero_optimization"]["offload_optimizer"]
    if device == "cpu":
        config["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": False}
    with engine_for(config) as engine:
        engine.module.eval()
        data = list(batches(3))
        with torch.no_grad():
            outputs = [engine(x, y) for x, y in data + data]
        swappers = {type(getattr(param, "nvme_swapper", None)).__name__ for param in engine.module.parameters()}
        tencache_swaps = swappers == {"TencacheParamSwapper"}
        return {"outputs": digest({f"{i:03d}": out for i, out in enumerate(outputs)}),
                "no_optimizer": engine.optimizer is None or not hasattr(engine.optimizer, "optimizer_swapper"),
                # the parameters stream through tencache's swapper where it is asked to hold them (a check that
                # reads True in both runs it compares)
                "swapped_as_asked": tencache_swaps == (budget is not None and device == "nvme+params")}


def unmanaged_accumulation(budget, device, nvme):
    """``"managed_gradient_accumulation": false`` (DeepSpeed 0.19's accumulation the caller drives): three
    backward passes, then ``step()``, which is the boundary and finalises the offloaded gradients itself
    (stage 3's ``finalize_gradient_accumulation_boundary``), three times."""
    config = dict(ds_config(budget, device, nvme), managed_gradient_accumulation=False)
    with engine_for(config) as engine:
        losses, data = [], iter(batches(9))
        for _ in range(3):
            for _ in range(3):
                loss = engine(*next(data))
                engine.backward(loss)
                losses.append(loss)
            engine.step()
        return losses_and_weights(engine, losses)


def two_engines(budget, device, nvme):
    """Two engines alive at once in one process, as DeepSpeed-Chat's actor and critic: from one config (one
    ``nvme_path``, so one optimizer swap folder for both), of different sizes, both models converted by
    ``deepspeed.initialize`` (their parameter swap files are then named from 0 alike), trained in turns, one step
    each, and the actor evaluated between steps. Then the actor saves a checkpoint, the critic steps, the actor
    loads its checkpoint back (which must not touch the critic's state), the critic saves one of its own (its
    swap files then have a second name), the actor is destroyed, and the critic steps on."""
    config = ds_config(budget, device, nvme, sub_group_size=HIDDEN * HIDDEN)
    if device == "nvme+params":  # the flat 16-bit partitions on file too, beyond 1000 elements
        config["zero_optimization"]["offload_param"]["max_in_cpu"] = 1000
    with contextlib.ExitStack() as critic_stack:
        critic = critic_stack.enter_context(engine_for(config, functools.partial(Layers, layers=2), zero_init=False))
        with contextlib.ExitStack() as actor_stack:
            actor = actor_stack.enter_context(engine_for(config, zero_init=False))
            losses = {"actor_losses": [], "critic_losses": [], "eval_losses": []}
            data = iter(batches(12))
            for _ in range(3):
                losses["actor_losses"] += trained(actor, [next(data)])
                losses["critic_losses"] += trained(critic, [next(data)])
                with torch.no_grad():
                    losses["eval_losses"].append(actor(*next(data)))
            actor.save_checkpoint(os.path.join(nvme, "actor-checkpoint"))
            losses["critic_losses"] += trained(critic, [next(data)])
            actor.load_checkpoint(os.path.join(nvme, "actor-checkpoint"))
            losses["actor_losses"] += trained(actor, [next(data)])
            critic.save_checkpoint(os.path.join(nvme, "critic-checkpoint"))
            result = {"actor_weights": digest(gathered(actor))}
        losses["critic_losses"] += trained(critic, [next(data)])  # the actor destroyed
        result.update({name: digest({f"{i:03d}": loss for i, loss in enumerate(values)})
                       for name, values in losses.items()})
        return dict(result, critic_weights=digest(gathered(critic)))


def skipped_update(budget, device, nvme):
    """A micro-batch whose gradients are not finite (a loss spike, a bad batch): stage 3 finds the global gradient
    norm invalid and skips that optimizer step (``engine.skipped_steps``), drops the gradients, and training goes
    on; in bf16 and fp32 as with fp16's loss scaler. Gradient accumulation 2 with several sub-groups, the poisoned
    micro-batch the second of an accumulation window, then the first of one."""
    config = ds_config(budget, device, nvme, gas=2, sub_group_size=HIDDEN * HIDDEN)
    with engine_for(config, functools.partial(Layers, layers=4)) as engine:
        losses = []
        for micro, (x, y) in enumerate(batches(12)):
            loss = engine(x, y)
            engine.backward(loss * float("inf") if micro in (3, 6) else loss)
            engine.step()
            losses.append(loss)
        # tencache's last metrics record is numbered by the engine's step count, the skipped steps counted
        # (metrics.StepMeter.optimizer_step); stock has none
        tencache = sys.modules.get("tencache_ds")
        numbered = tencache is None or tencache.stats(engine)["step"] == engine.global_steps - 1
        return {**losses_and_weights(engine, losses), "skipped": engine.skipped_steps,
                "two_skipped": engine.skipped_steps == 2, "records_numbered_by_step": numbered}


class Block(torch.nn.Module):
    """Two layers that stage 3 fetches and releases together when marked a leaf (``set_z3_leaf_modules``, as
    DeepSpeed's MoE models mark their experts)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        return x + torch.relu(self.b(torch.relu(self.a(x))))


class LeafBlocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.cross_entropy_loss = torch.nn.CrossEntropyLoss()
        deepspeed.utils.set_z3_leaf_modules(self, [Block])

    def forward(self, x, y):
        for block in self.blocks:
            x = block(x)
        return self.cross_entropy_loss(x.float(), y)


def run_changes(budget, device, nvme):
    """What changes the order a step uses its tensors in, or their dtype: DeepSpeed's ``torch_autocast`` (fp32
    parameters and masters, bf16 compute) instead of bf16, leaf modules whose parameters stage 3 fetches together, and
    the batch size changed twice mid-run (``engine.set_train_batch_size``: gradient accumulation 1, then 3, then 1),
    so that a profiled step stops predicting the next one. ``sub_group_size`` one layer's weight: about two
    layers' partitions a sub-group at 2 ranks."""
    config = ds_config(budget, device, nvme, sub_group_size=HIDDEN * HIDDEN)
    del config["bf16"]
    config.update(torch_autocast={"enabled": True, "dtype": "bfloat16"}, train_batch_size=2 * 2)
    data = [(x.float().requires_grad_(True), y) for x, y in batches(15)]  # a leaf's backward needs an input's grad
    with engine_for(config, LeafBlocks) as engine:
        losses = trained(engine, data[:3])
        engine.set_train_batch_size(2 * 2 * 3)
        losses += trained(engine, data[3:12])
        engine.set_train_batch_size(2 * 2)
        losses += trained(engine, data[12:])
        return dict(losses_and_weights(engine, losses), steps=engine.global_steps, nine_steps=engine.global_steps == 9)


# two engines for the suite's time: each knob away from DeepSpeed's default in one of them
GRADIENT_PATH_KNOBS = {"not_contiguous_no_overlap_round_robin": {"contiguous_gradients": False, "overlap_comm": False,
                                                                 "round_robin_gradients": True},
                       "all_reduce_small_buckets": {"reduce_scatter": False, "reduce_bucket_size": 300_000,
                                                    "stage3_prefetch_bucket_size": 100_000,
                                                    "stage3_use_all_reduce_for_fetch_params": True}}


def gradient_paths(budget, device, nvme):
    """Stage 3's knobs that change how a gradient reaches the offloaded optimizer: without contiguous gradients,
    without reduce-scatter (an all-reduce), without overlapped communication, round-robin gradients, buckets
    smaller than a layer (``GRADIENT_PATH_KNOBS``); with gradient accumulation 2 and ``sub_group_size`` one layer's
    weight. And how a parameter is gathered: by an all-reduce (``stage3_use_all_reduce_for_fetch_params``)."""
    results = {}
    for name, knobs in GRADIENT_PATH_KNOBS.items():
        config = ds_config(budget, device, os.path.join(nvme, name), gas=2, sub_group_size=HIDDEN * HIDDEN,
                           **knobs)
        with engine_for(config, functools.partial(Layers, layers=4)) as engine:
            results[name] = losses_and_weights(engine, trained(engine, batches(6)))
    return results


def unwrap_for_generation(budget, device, nvme):
    """test_unwrap_model.py's TestUnwrapModel and TestUnwrapModelTraceInvalidate, trained: between steps,
    ``unwrap_model_for_generation`` (TRL's generation in RLHF) gathers every parameter and takes ZeRO-3's hooks off;
    a forward runs on the whole model there; the hooks go back on (stage 3 invalidates the step's trace) and
    training goes on. The forward's output, the losses, the weights (the results: a stale trace in tencache's
    prefetch would cost time, not bits, and is not looked for here)."""
    from deepspeed.runtime.zero import unwrap_model_for_generation

    with engine_for(ds_config(budget, device, nvme)) as engine:
        data = list(batches(5))
        losses = trained(engine, data[:2])
        with unwrap_model_for_generation(engine) as whole:
            unhooked = not list(engine.optimizer.parameter_offload.forward_hooks)
            with torch.no_grad():
                generated = whole(*data[2])
        hooked = bool(list(engine.optimizer.parameter_offload.forward_hooks))
        losses += trained(engine, data[2:])
        return dict(losses_and_weights(engine, losses), generated=digest({"loss": generated}), unhooked=unhooked,
                    hooked=hooked)


class FrozenBlock(torch.nn.Module):
    """A LoRA-shaped block: a frozen layer norm and base layer, and a trainable low-rank adapter beside the base."""

    def __init__(self):
        super().__init__()
        self.norm, self.base = torch.nn.LayerNorm(HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.lora_a, self.lora_b = torch.nn.Linear(HIDDEN, 8, bias=False), torch.nn.Linear(8, HIDDEN, bias=False)
        for param in (*self.norm.parameters(), *self.base.parameters()):
            param.requires_grad_(False)

    def forward(self, x):
        h = self.norm(x)
        return x + torch.relu(self.base(h) + self.lora_b(self.lora_a(h)))


class TwoOutputLeaf(torch.nn.Module):
    """A frozen layer norm and two trainable layers, returning both layers' outputs; marked a leaf, so stage 3
    fetches its parameters together and its backward hook fires once for each output."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN).requires_grad_(False)
        self.a, self.b = torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        h = self.norm(x)
        return self.a(h), self.b(h)


class TwoOutputLeafBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.leaf = TwoOutputLeaf()

    def forward(self, x):
        a, b = self.leaf(x)
        return x + torch.relu(a + b)


class CheckpointedFrozenBlocks(torch.nn.Module):
    """Three blocks with a frozen base, each under ``torch.utils.checkpoint`` in training, and a trainable head."""

    def __init__(self, use_reentrant, block=FrozenBlock):
        super().__init__()
        self.blocks = torch.nn.ModuleList(block() for _ in range(3))
        if block is TwoOutputLeafBlock:
            deepspeed.utils.set_z3_leaf_modules(self, [TwoOutputLeaf])
        self.head = torch.nn.Linear(HIDDEN, HIDDEN)
        self.use_reentrant = use_reentrant
        self.cross_entropy_loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, y):
        for block in self.blocks:
            if self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.use_reentrant)
            else:
                x = block(x)
        return self.cross_entropy_loss(self.head(x).float(), y)


def frozen_checkpointed(budget, device, nvme):
    """test_zero_user_backward.py's frozen-parameter checkpointing tests (TestZeroFrozenParamCheckpointingVariants'
    multi-block and LoRA-style models, TestZeroFrozenParamNoGradInputAccumulation), trained: LoRA with gradient
    checkpointing, the frozen base re-gathered by each block's recompute in backward (stage 3 releases what a
    recompute gathers with the module whose backward is running). Reentrant and non-reentrant checkpointing, and
    TestZeroFrozenParamMultiTensorLeaf's leaf of two outputs (non-reentrant), each with gradient accumulation 2 and an
    evaluation pass between steps. The non-reentrant blocks' inputs do not require a gradient; the reentrant ones'
    do (their adapters get none otherwise), and the leaf's. Every parameter is partitioned after each optimizer
    step."""
    results = {}
    # (a leaf's inputs must require a gradient for its backward hook to run, DeepSpeed #5074: with an input that
    # does not, stock fails in the first backward, offloaded or not)
    for name, use_reentrant, block, input_grad in (("reentrant", True, FrozenBlock, True),
                                                   ("non_reentrant", False, FrozenBlock, False),
                                                   ("two_output_leaf", False, TwoOutputLeafBlock, True)):
        config = ds_config(budget, device, os.path.join(nvme, name), gas=2)
        with engine_for(config, functools.partial(CheckpointedFrozenBlocks, use_reentrant, block)) as engine:
            losses, partitioned = [], True
            for micro, (x, y) in enumerate(batches(8)):
                loss = engine(x.requires_grad_(input_grad), y)
                engine.backward(loss)
                engine.step()
                losses.append(loss)
                if micro % 2 == 1:  # after an optimizer step
                    partitioned &= all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE
                                       for p in engine.module.parameters())
                if micro == 3:
                    engine.eval()
                    with torch.no_grad():
                        losses.append(engine(x, y))
                    engine.train()
            results[name] = dict(losses_and_weights(engine, losses), partitioned=partitioned)
    return results


class LayersRaisingInForward(Layers):
    """Four layers; after the second, an error while ``armed`` (an out-of-memory error in a forward)."""

    def __init__(self):
        super().__init__(layers=4)
        self.armed = False

    def forward(self, x, y):
        for index, layer in enumerate(self.ll):
            x = x + torch.relu(layer(x))
            if index == 1 and self.armed:
                raise RuntimeError("injected error in forward")
        return self.cross_entropy_loss(x.float(), y)


def forward_raises(budget, device, nvme):
    """A forward that stops half-way with an exception the training loop catches (an out-of-memory error on a long
    batch), the batch dropped and training on with the next: the first two layers gathered and in use when it
    comes. Once at the first micro-batch of an accumulation window of 2, once at the second (the first's gradients
    handed to the optimizer), a sub-group per layer (about two layers' partitions each at 2 ranks)."""
    config = ds_config(budget, device, nvme, gas=2, sub_group_size=HIDDEN * HIDDEN)
    with engine_for(config, LayersRaisingInForward) as engine:
        losses, raised = [], []
        for micro, (x, y) in enumerate(batches(12)):
            engine.module.armed = micro in (2, 7)
            try:
                loss = engine(x, y)
            except RuntimeError as err:
                raised.append("injected error in forward" in str(err))
                continue
            engine.backward(loss)
            engine.step()
            losses.append(loss)
        return dict(losses_and_weights(engine, losses), steps=engine.global_steps, raised=raised == [True, True])

class TwoHeads(torch.nn.Module):
    """Two square layers of which a forward uses one (``use_a``): the other gets no gradient."""

    def __init__(self):
        super().__init__()
        self.head_a, self.head_b = (torch.nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(2))
        self.use_a = True
        self.cross_entropy_loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, y):
        return self.cross_entropy_loss((self.head_a if self.use_a else self.head_b)(x).float(), y)


def varying_accumulation(budget, device, nvme):
    """test_zero_user_backward.py's TestUnmanagedGradientAccumulation::test_unmanaged_varying_backward_count and
    TestUnmanagedGradientAccumulationOffloadInactiveParams: accumulation windows of 2, 5 and 3 micro-batches (each
    loss divided by its window's length), driven by the caller (``managed_gradient_accumulation`` false: the
    ``step()`` is the boundary; every step applied, ``global_samples`` advanced by the window) and by DeepSpeed with
    ``set_gradient_accumulation_boundary`` at each window's last micro-batch; and windows in which one of two
    layers gets no gradient at all (``ignore_unused_parameters``), managed and not, each layer a sub-group of its
    own."""
    results, windows = {}, (2, 5, 3)
    for managed in (False, True):
        config = dict(ds_config(budget, device, os.path.join(nvme, f"managed={managed}"), gas=4,
                                sub_group_size=HIDDEN * HIDDEN), managed_gradient_accumulation=managed)
        with engine_for(config, functools.partial(Layers, layers=4)) as engine:
            losses, data, counted = [], iter(batches(sum(windows))), True
            for window in windows:
                samples = engine.global_samples
                for micro in range(window):
                    if managed:
                        engine.set_gradient_accumulation_boundary(micro == window - 1)
                    loss = engine(*next(data))
                    engine.backward(loss / window, scale_wrt_gas=False)
                    losses.append(loss)
                    if managed:
                        engine.step()
                if not managed:
                    engine.step()
                    counted &= engine.was_step_applied() and engine.global_samples == samples + 2 * 2 * window
            results[f"managed={managed}"] = dict(losses_and_weights(engine, losses), counted=counted)
    for managed in (False, True):
        config = dict(ds_config(budget, device, os.path.join(nvme, f"inactive-managed={managed}"), gas=2,
                                sub_group_size=HIDDEN * HIDDEN, ignore_unused_parameters=True),
                      managed_gradient_accumulation=managed)
        with engine_for(config, TwoHeads) as engine:
            losses, data = [], iter(batches(14))
            # the second layer unused for five windows: its update's gradient kept after four (gradient_fragments.py)
            for use_a in (True, False) + (True,) * 5:
                engine.module.use_a = use_a
                for _ in range(2):
                    loss = engine(*next(data))
                    engine.backward(loss)
                    losses.append(loss)
                    if managed:
                        engine.step()
                if not managed:
                    engine.step()
            results[f"inactive-managed={managed}"] = losses_and_weights(engine, losses)
    # each head a sub-group of its own at 2 ranks too (half a layer a partition): the second one has no gradient at
    # its first step (stock CPU offload steps it with zeros; the NVMe path stopped in stage 3's unscale: helper-190)
    config = ds_config(budget, device, os.path.join(nvme, "inactive-own-sub-groups"), gas=2,
                       sub_group_size=HIDDEN * HIDDEN // 2, ignore_unused_parameters=True)
    with engine_for(config, TwoHeads) as engine:
        losses, data = [], iter(batches(6))
        for use_a in (True, False, True):
            engine.module.use_a = use_a
            for _ in range(2):
                loss = engine(*next(data))
                engine.backward(loss)
                engine.step()
                losses.append(loss)
        results["inactive-own-sub-groups"] = losses_and_weights(engine, losses)
    return results


class LayersOutput(Layers):
    """Layers that return their last hidden state: a non-scalar output, for a backward given its gradient; with
    ``reentrant``, each layer under reentrant activation checkpointing (its forward runs again in the backward)."""

    def __init__(self, reentrant=False):
        super().__init__()
        self.reentrant = reentrant

    def forward(self, x):
        for layer in self.ll:
            if self.reentrant:
                x = x + torch.relu(torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=True))
            else:
                x = x + torch.relu(layer(x))
        return x


def user_backward(budget, device, nvme):
    """test_zero_user_backward.py's PyTorch-style backward (DeepSpeed 0.18+: the engine's hooks run without
    ``engine.backward``), GAS 2: ``loss.backward()`` (TestZeroUserBackwardBasic), ``engine.scale(loss).backward()``
    (TestZeroUserBackwardWithScale), a non-scalar output's ``backward(gradient)`` (TestZeroUserBackwardNonScalar),
    the same with each layer under reentrant checkpointing (TestZeroUserBackwardWithCheckpointing), and three engines
    whose losses are summed into one backward (TestZeroUserBackwardMultipleEngines: their hooks interleave in one
    autograd pass), each then ``engine.step()``."""
    results = {}
    models = {"loss_backward": Layers, "scale_backward": Layers, "non_scalar": LayersOutput,
              "checkpointed_non_scalar": functools.partial(LayersOutput, reentrant=True)}
    for name, model in models.items():
        config = ds_config(budget, device, os.path.join(nvme, name), gas=2)
        with engine_for(config, model) as engine:
            losses = []
            for x, y in batches(6):
                if model is not Layers:
                    out = engine(x.requires_grad_(True))
                    out.backward(torch.full_like(out, 1e-3) * y.view(-1, 1).to(out.dtype))
                    losses.append(out.float().pow(2).sum())
                else:
                    loss = engine(x, y)
                    (engine.scale(loss) if name == "scale_backward" else loss).backward()
                    losses.append(loss)
                engine.step()
            results[name] = losses_and_weights(engine, losses)
    with contextlib.ExitStack() as stack:
        engines = []
        for index in range(3):  # models of 2, 3 and 4 layers
            config = ds_config(budget, device, os.path.join(nvme, f"combined-{index}"), gas=2)
            engines.append(stack.enter_context(engine_for(config, functools.partial(Layers, layers=2 + index))))
        losses = []
        for x, y in batches(4):
            combined = sum(engine(x, y) / (index + 1) for index, engine in enumerate(engines))
            combined.backward()
            for engine in engines:
                engine.step()
            losses.append(combined)
        results["combined"] = {"losses": digest({f"{i}": loss for i, loss in enumerate(losses)}),
                               "weights": [digest(gathered(engine)) for engine in engines]}
    return results


class Composed(torch.nn.Module):
    """An encoder built in a ``zero.Init`` of its own inside the one the whole model is built in (Hugging Face's
    VisionEncoderDecoderModel builds its parts so), and a decoder built in the outer one."""

    def __init__(self, config):
        super().__init__()
        with deepspeed.zero.Init(config_dict_or_path=config):
            self.encoder = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(2))
        self.decoder = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(2))
        self.cross_entropy_loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, y):
        for layer in (*self.encoder, *self.decoder):
            x = x + torch.relu(layer(x))
        return self.cross_entropy_loss(x.float(), y)


def nested_init(budget, device, nvme):
    """test_zero_nesting_init.py (TestNestingInit, TestNestedParallelInit), trained: a model whose encoder is built
    in a ``zero.Init`` nested in the one the whole model is built in (every parameter a ZeRO-3 parameter, checked);
    GAS 2."""
    config = ds_config(budget, device, nvme, gas=2)
    with engine_for(config, functools.partial(Composed, config)) as engine:
        zero_params = all(hasattr(param, "ds_id") for param in engine.module.parameters())
        return dict(losses_and_weights(engine, trained(engine, batches(6))), zero_params=zero_params)


SCENARIOS = {"unbalanced": unbalanced, "repeat": repeat, "step_count": step_count, "backward_thrice": backward_thrice,
             "empty_cache": empty_cache, "empty_group": empty_group, "external": external, "modified": modified,
             "other_optimizers": other_optimizers, "unmanaged_accumulation": unmanaged_accumulation,
             "inference": inference,
             "two_engines": two_engines, "skipped_update": skipped_update,
             "gradient_paths": gradient_paths, "muon": muon, "run_changes": run_changes,
             "unwrap_for_generation": unwrap_for_generation, "frozen_checkpointed": frozen_checkpointed,
             "forward_raises": forward_raises, "varying_accumulation": varying_accumulation,
             "user_backward": user_backward, "nested_init": nested_init,
             # the upstream test's own getter: fails with the optimizer on NVMe, stock's swappers and tencache's alike
             "grad_partitions": functools.partial(backward_thrice, partitions_getter=True)}


def main(scenarios, mode, device, nvme):
    budgets = [None] if mode == "stock" else (mode.partition("=")[2] or "auto").split(",")
    run_scenarios([(scenario if budget is None else f"{scenario}@{budget}",
                    functools.partial(SCENARIOS[scenario], budget, device, os.path.join(nvme, f"{scenario}@{budget}")))
                   for budget in budgets for scenario in scenarios.split(",")])


if __name__ == "__main__":
    main(*ARGS[:4])
