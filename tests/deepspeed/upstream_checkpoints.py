"""Our versions of some of DeepSpeed's own checkpoint tests, with the optimizer offloaded (our code, written after
the scenarios of tests/unit/v1/zero/test_zero.py::TestZeroToFP32::test_1_param_group and tests/unit/checkpoint/
test_zero_optimizer.py::TestZeROSaveLoadEdgeCase::test_immediate_save_load / ::test_load_immediate_save /
::test_save_before_accum_grad_is_done, TestZeROCheckpoint::test_load_optimizer_state /
test_not_load_optimizer_state / test_load_module_only, test_latest_checkpoint.py, test_tag_validation.py and
tests/unit/runtime/zero/test_nvme_checkpointing.py in DeepSpeed's repository;
fp32 (bf16 in TestZeROCheckpoint's, in save_before_accumulation_is_done and at another world size) instead of
fp16, the CPU accelerator, 2 ranks, layers of 1024 so that the optimizer state is large enough to be swapped).
Rank 0 prints one RESULT line.

    deepspeed --num_gpus 2 tests/deepspeed/upstream_checkpoints.py SCENARIOS stock|tencache[=BYTES] nvme|cpu
        NVME_DIR CKPT_DIR

SCENARIOS: comma-separated, of zero_to_fp32, zero_to_fp32_frozen, zero_to_fp32_frozen_params_offloaded,
immediate_save_load, load_immediate_save,
load_into_new_engine, loss_scale_restored, load_saved_before_any_step, save_before_accumulation_is_done,
latest_checkpoint, tag_validation, integer_tag (not upstream), nvme_checkpointing, load_into_trained_engine and
load_after_a_backward_without_its_step (the last two not upstream), loads_params_beyond_max_in_cpu and
load_into_reordered_model (not upstream), save_for_other_world_size and load_at_other_world_size (the second in a
launch of another world size, on the first's checkpoint: ``deepspeed --num_gpus 1``), load_saved_on_cpu and
saved_on_nvme (not upstream; the second with the optimizer on cpu loads what it saved with the optimizer on NVMe in
another launch); they run one after the other in the same processes (one launch: its start-up is most of a
scenario's time), each with its own engines and its own folders under NVME_DIR and CKPT_DIR. The result maps each
scenario to the SHA-256 sums of the weights (and losses) it produces, so that runs can be compared bit for bit,
and, where it fails, its error (the scenarios after a failure do not run). ``tencache=BYTES``: that
``host_cache_bytes`` (default: the block's own, "auto").
"""
import functools
import os
import sys

import torch

from scenarios import digest, gathered, run_scenarios  # tests/deepspeed/scenarios.py

ARGS = [arg for arg in sys.argv[1:] if not arg.startswith("--local_rank")]  # the launcher adds --local_rank=N
if ARGS[1].startswith("tencache"):
    import tencache_ds  # noqa: F401  (installs the swappers; DeepSpeed is imported already where forked)
import deepspeed  # noqa: E402
from deepspeed.utils.zero_to_fp32 import (get_fp32_state_dict_from_zero_checkpoint,  # noqa: E402
                                          load_state_dict_from_zero_checkpoint)

HIDDEN = 1024


def ds_config(mode, device, nvme, micro_batch, grad_accum, lr=1e-3, bf16=False, params_too=False):
    """``params_too``: the parameters offloaded to ``device`` as well."""
    offload = {"device": device, "pin_memory": False}
    if device == "nvme":
        offload.update(nvme_path=nvme, buffer_count=4)
    config = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": grad_accum,
              "steps_per_print": 1000000, "optimizer": {"type": "Adam", "params": {"lr": lr}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "offload_optimizer": offload},
              "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                      "overlap_events": True}}
    if params_too:
        config["zero_optimization"]["offload_param"] = dict(offload)
    if mode.startswith("tencache"):  # "tencache=BYTES": that host_cache_bytes
        config["tencache"] = {"host_cache_bytes": int(mode.partition("=")[2])} if "=" in mode else {}
    if bf16:
        config["bf16"] = {"enabled": True}
    return config


class Layers(torch.nn.Module):
    """test_1_param_group's model: ``n_layers`` square linear layers and a classifier that forward never uses (an
    uneven parameter count); ``freeze`` freezes the first layer."""

    def __init__(self, n_layers, freeze):
        super().__init__()
        self.ll = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(n_layers))
        self.classifier = torch.nn.Linear(4, 1)
        self.cross_entropy_loss = torch.nn.CrossEntropyLoss()
        if freeze:
            self.ll[0].weight.requires_grad = False
            self.ll[0].bias.requires_grad = False

    def forward(self, x, y):
        hidden = x
        for layer in self.ll:
            hidden = layer(hidden)
        return self.cross_entropy_loss(hidden, y)


class LayersReordered(Layers):
    """``Layers`` with its parameters registered in another order, the same names and shapes (a refactor between
    the save and the load)."""

    def __init__(self, n_layers, freeze):
        torch.nn.Module.__init__(self)
        self.classifier = torch.nn.Linear(4, 1)
        self.ll = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(n_layers))
        self.cross_entropy_loss = torch.nn.CrossEntropyLoss()
        if freeze:
            self.ll[0].weight.requires_grad = False


class Simple(Layers):
    """The edge cases' model: one linear layer."""

    def __init__(self):
        super().__init__(1, False)


def batches(count, micro_batch, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed + torch.distributed.get_rank())
    for _ in range(count):
        yield (torch.randn(micro_batch, HIDDEN, generator=generator).to(dtype),
               torch.randint(0, HIDDEN, (micro_batch,), generator=generator))


def train(engine, count, micro_batch, dtype=torch.float32):
    for x, y in batches(count, micro_batch, seed=7, dtype=dtype):
        engine.backward(engine(x, y))
        engine.step()


def zero_to_fp32(mode, device, nvme, ckpt, freeze, params_too=False):
    """``params_too``: the parameters offloaded too (frozen ones on NVMe were saved as their swapped-out
    placeholder, a 0-dim tensor, and zero_to_fp32 stopped on it: helper-182)."""
    torch.manual_seed(1234)
    config = ds_config(mode, device, nvme, 2, 2, params_too=params_too)
    # (parameters offloaded are partitioned as built: zero.Init; the engine's own conversion of a plain model
    # leaves the weights bf16 in an fp32 run, stock's too)
    with deepspeed.zero.Init(config_dict_or_path=config, enabled=params_too):
        model = Layers(2 * torch.distributed.get_world_size(), freeze)
    engine, *_ = deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())
    engine.empty_partition_cache()
    train(engine, 8, 2)
    engine.empty_partition_cache()
    engine.save_checkpoint(ckpt)
    torch.distributed.barrier()
    before = gathered(engine)
    with deepspeed.zero.GatheredParameters(list(engine.parameters()), modifier_rank=None):
        fp32_model = load_state_dict_from_zero_checkpoint(engine.module, ckpt)
        loaded = {name: tensor.clone() for name, tensor in fp32_model.state_dict().items()}
    consolidated = get_fp32_state_dict_from_zero_checkpoint(ckpt)
    equal = all(torch.equal(before[name], loaded[name]) for name in before)
    engine.destroy()
    result = {"trained": digest(before), "fp32": digest(consolidated), "loaded_equals_trained": equal}
    if params_too:  # engines over a model initialised otherwise load it, the frozen layer's weights too
        for load, kwargs in (("reloaded", {}), ("reloaded_weights_only", {"load_optimizer_states": False})):
            engine = frozen_base_engine(config, freeze)
            engine.load_checkpoint(ckpt, **kwargs)
            result[load] = digest(gathered(engine))
            engine.destroy()
        if mode.startswith("tencache"):
            result["placeholders_keep_weights"] = placeholders_keep_weights(config, freeze, ckpt)
    return result


def frozen_base_engine(config, freeze):
    torch.manual_seed(4321)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = Layers(2 * torch.distributed.get_world_size(), freeze)
    engine, *_ = deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())
    return engine


def placeholders_keep_weights(config, freeze, ckpt):
    """A checkpoint whose frozen fragments are swapped-out placeholders (0-dim tensors holding 1: what stock NVMe
    offload and tencache before 2026-12-07 saved) loaded with the frozen partitions read first: they keep their
    weights (copied, the placeholder's 1 filled them: helper-188)."""
    engine = frozen_base_engine(config, freeze)
    with open(os.path.join(ckpt, "latest")) as latest:
        path = engine._get_ckpt_name(ckpt, latest.read().strip())
    state = torch.load(path, weights_only=False)
    state["frozen_param_fragments"] = {name: torch.tensor(1).half() for name in state["frozen_param_fragments"]}
    torch.save(state, path)
    torch.distributed.barrier()
    frozen = [name for name, param in engine.module.named_parameters() if not param.requires_grad]
    before = {name: weight for name, weight in gathered(engine).items() if name in frozen}
    engine.load_checkpoint(ckpt)
    after = gathered(engine)
    engine.destroy()
    return bool(frozen) and all(torch.equal(before[name], after[name]) for name in frozen)


def immediate_save_load(mode, device, nvme, ckpt):
    torch.manual_seed(1234)
    model = Simple()
    engine, *_ = deepspeed.initialize(config=ds_config(mode, device, nvme, 2, 1), model=model,
                                      model_parameters=model.parameters())
    engine.save_checkpoint(ckpt)
    engine.load_checkpoint(ckpt, load_optimizer_states=False, load_lr_scheduler_states=False, load_module_only=False)
    result = {"loaded": digest(gathered(engine)), "fp32": digest(get_fp32_state_dict_from_zero_checkpoint(ckpt))}
    train(engine, 1, 2)  # and it trains on
    result["trained"] = digest(gathered(engine))
    engine.destroy()
    return result


def load_immediate_save(mode, device, nvme, ckpt):
    torch.manual_seed(1234)
    model = Simple()
    config = ds_config(mode, device, nvme, 2, 1)
    engine, *_ = deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())
    train(engine, 1, 2)
    engine.empty_partition_cache()
    engine.save_checkpoint(ckpt)
    first = digest(get_fp32_state_dict_from_zero_checkpoint(ckpt))
    engine.destroy()
    engine, *_ = deepspeed.initialize(config=ds_config(mode, device, nvme, 2, 1), model=model,
                                      model_parameters=model.parameters())
    engine.load_checkpoint(ckpt, load_optimizer_states=False, load_lr_scheduler_states=False, load_module_only=False)
    engine.save_checkpoint(ckpt)
    result = {"saved": first, "loaded": digest(gathered(engine)),
              "saved_again": digest(get_fp32_state_dict_from_zero_checkpoint(ckpt))}
    engine.destroy()
    return result


def bf16_engine(mode, device, nvme, betas, weight_decay):
    """The engine of TestZeROCheckpoint's tests, in bf16: a warm-up lr scheduler, Adam with ``betas`` and
    ``weight_decay``, DeepSpeed's default persistence threshold (the biases are kept whole on every rank)."""
    config = ds_config(mode, device, nvme, 2, 1, bf16=True)
    config["optimizer"]["params"].update(betas=betas, weight_decay=weight_decay)
    config["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                                                          "warmup_num_steps": 4}}
    del config["zero_optimization"]["stage3_param_persistence_threshold"]
    model = Layers(2, False)
    return deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())[0]


def train_recording(engine, count, seed):
    """``count`` bf16 steps; the digest of their losses."""
    return recorded(engine, batches(count, 2, seed=seed, dtype=torch.bfloat16))


def recorded(engine, micro_batches):
    """A forward, backward and step for each of ``micro_batches``; the digest of their losses."""
    losses = []
    for x, y in micro_batches:
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss)
    return digest({f"{i}": loss for i, loss in enumerate(losses)})


def loss_scale_restored(mode, device, nvme, ckpt):
    """Not upstream: the loss scaler's state is saved with the optimizer's (the ZeRO file) and a load of the
    optimizer's state restores it (stock CPU offload's does; stock's NVMe load skipped it, so an fp16 run's dynamic
    scale restarted at its initial power). fp32 here, the CPU accelerator having no fp16: its static scaler set to
    another scale before the save; a new engine that loads the checkpoint has that scale, and trains on."""
    torch.manual_seed(1234)
    model = Simple()
    engine, *_ = deepspeed.initialize(config=ds_config(mode, device, nvme, 2, 1), model=model,
                                      model_parameters=model.parameters())
    train(engine, 2, 2)
    engine.optimizer.loss_scaler.cur_scale = 4.0
    engine.save_checkpoint(ckpt)
    engine.destroy()
    torch.manual_seed(4321)
    model = Simple()
    engine, *_ = deepspeed.initialize(config=ds_config(mode, device, nvme, 2, 1), model=model,
                                      model_parameters=model.parameters())
    before = engine.optimizer.loss_scaler.cur_scale
    engine.load_checkpoint(ckpt)
    after = engine.optimizer.loss_scaler.cur_scale
    train(engine, 1, 2)
    engine.destroy()
    return {"scale_before_load": float(before), "scale_after_load": float(after)}


def load_saved_before_any_step(mode, device, nvme, ckpt):
    """Not upstream: a checkpoint saved right after ``initialize`` (no optimizer state yet), loaded with its
    optimizer's state by the engine after it trained 2 steps, which trains on: Adam starts over, as it does with
    the optimizer on cpu (torch's ``load_state_dict`` of an empty state). Then the same again from a checkpoint saved
    right after that load (its sub-groups' state saved empty). The losses and trained weights."""
    torch.manual_seed(1234)
    model = Simple()
    engine, *_ = deepspeed.initialize(config=ds_config(mode, device, nvme, 2, 1), model=model,
                                      model_parameters=model.parameters())
    engine.save_checkpoint(ckpt, tag="initialized")
    train(engine, 2, 2)
    engine.load_checkpoint(ckpt, tag="initialized")
    engine.save_checkpoint(ckpt, tag="loaded")
    # no moment files in that checkpoint (none with the optimizer on cpu): until 2026-12-07 tencache's linked the
    # forgotten ones of the engine's own training, which its ZeRO file says are empty
    saved = os.path.join(ckpt, "loaded", "offloaded_tensors")
    result = {"moment files saved": sorted(name for _root, _dirs, names in os.walk(saved) for name in names
                                           if name.startswith("exp_avg")),
              "loaded": digest(gathered(engine)), "losses": recorded(engine, batches(2, 2, seed=11)),
              "trained": digest(gathered(engine))}
    engine.load_checkpoint(ckpt, tag="loaded")
    result["again"] = {"losses": recorded(engine, batches(2, 2, seed=11)), "trained": digest(gathered(engine))}
    engine.destroy()
    return result


def load_into_new_engine(mode, device, nvme, ckpt):
    """TestZeROCheckpoint's test_load_optimizer_state, test_not_load_optimizer_state and test_load_module_only: an
    engine trains 3 steps and saves; a new engine, with another initialisation and other betas and weight decay (a
    load of the optimizer's state restores the saved ones), loads it in the same process (the optimizer's state,
    or not, or the module only) and trains 3 more. Each load's losses and trained weights."""
    torch.manual_seed(1234)
    engine = bf16_engine(mode, device, nvme, [0.8, 0.999], 3e-7)
    train(engine, 3, 2, torch.bfloat16)
    engine.save_checkpoint(ckpt)
    engine.destroy()
    result = {}
    for load in ("optimizer", "no_optimizer", "module_only"):
        torch.manual_seed(4321)
        engine = bf16_engine(mode, device, nvme, [0.85, 0.99], 1e-6)
        engine.load_checkpoint(ckpt, load_optimizer_states=load == "optimizer",
                               load_lr_scheduler_states=load == "optimizer", load_module_only=load == "module_only")
        result[load] = {"losses": train_recording(engine, 3, seed=11), "trained": digest(gathered(engine))}
        engine.destroy()
    return result


def load_into_trained_engine(mode, device, nvme, ckpt):
    """Not an upstream test: an engine that has trained loads a checkpoint without its optimizer's state (or the
    module only) and trains 3 more steps. The weights go back to the checkpoint's; Adam's moments and step counts
    stay the live engine's, as with the optimizer on cpu (with the optimizer on NVMe the engine copies the
    checkpoint's moment files over the live ones). Three cases, each with an engine of its own: the engine that
    saved loads without the optimizer's state 2 steps after its save; the same, the module only; a rebuilt engine
    (other parameter ids, so the loaded masters are renamed) that trained 2 steps of its own loads without it."""
    result = {}
    for load in ("no_optimizer", "module_only", "rebuilt"):
        torch.manual_seed(1234)
        engine = bf16_engine(mode, device, os.path.join(nvme, load), [0.8, 0.999], 3e-7)
        train(engine, 3, 2, torch.bfloat16)
        engine.save_checkpoint(os.path.join(ckpt, load))
        if load == "rebuilt":
            engine.destroy()
            torch.manual_seed(4321)
            engine = bf16_engine(mode, device, os.path.join(nvme, load), [0.8, 0.999], 3e-7)
        train(engine, 2, 2, torch.bfloat16)
        engine.load_checkpoint(os.path.join(ckpt, load), load_optimizer_states=False,
                               load_lr_scheduler_states=False, load_module_only=load == "module_only")
        loaded = digest(gathered(engine))
        result[load] = {"loaded": loaded, "losses": train_recording(engine, 3, seed=11),
                        "trained": digest(gathered(engine))}
        engine.destroy()
    return result


def load_after_a_backward_without_its_step(mode, device, nvme, ckpt):
    """Not an upstream test: an engine trains 3 steps and saves, trains 2 more, runs a backward whose step never
    comes (a step skipped on overflow, a load in the middle of gradient accumulation), then loads the checkpoint with
    its optimizer's state and trains 3 more steps. Under tencache the state streams (``host_cache_bytes`` 0), so that
    backward reads the update's first sub-group ahead, from the files the load then replaces: the load's swap-ins
    were served those reads, 2 steps newer than the checkpoint, until 2026-12-02. The losses and trained weights."""
    if mode.startswith("tencache"):
        mode = "tencache=0"
    torch.manual_seed(1234)
    engine = bf16_engine(mode, device, nvme, [0.8, 0.999], 3e-7)
    train(engine, 3, 2, torch.bfloat16)
    engine.save_checkpoint(ckpt)
    train(engine, 2, 2, torch.bfloat16)
    issued = reads_issued(engine, mode)
    for x, y in batches(1, 2, seed=5, dtype=torch.bfloat16):
        engine.backward(engine(x, y))
    if mode.startswith("tencache") and reads_issued(engine, mode) == issued:
        raise AssertionError("the backward read nothing ahead: the scenario tests nothing")
    engine.load_checkpoint(ckpt)
    result = {"losses": train_recording(engine, 3, seed=11), "trained": digest(gathered(engine))}
    engine.destroy()
    return result


def save_before_accumulation_is_done(mode, device, nvme, ckpt):
    """TestZeROSaveLoadEdgeCase::test_save_before_accum_grad_is_done (stage 3, bf16), carried on: with GAS 2, after
    one micro-batch's backward and step (no update: the window is not done), ``save_16bit_model`` and
    ``save_checkpoint``; then the window's second micro-batch and two more steps; then a fresh engine loads that
    checkpoint and trains two steps. Under tencache the state streams (``host_cache_bytes`` 0), so that the backward
    has read the update's first sub-group ahead when the saves come. The 16-bit model's weights, and the losses and
    trained weights of both engines."""
    if mode.startswith("tencache"):
        mode = "tencache=0"

    def new_engine():
        torch.manual_seed(1234)
        config = ds_config(mode, device, nvme, 2, 2, bf16=True)
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
        model = Layers(2, False)
        return deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())[0]

    def steps(engine, micro_batches):
        return {"losses": recorded(engine, micro_batches), "trained": digest(gathered(engine))}

    micro_batches = list(batches(6, 2, seed=13, dtype=torch.bfloat16))
    engine = new_engine()
    issued = reads_issued(engine, mode)
    steps(engine, micro_batches[:1])
    if mode.startswith("tencache") and reads_issued(engine, mode) == issued:
        raise AssertionError("the backward read nothing ahead: the scenario tests nothing")
    engine.empty_partition_cache()
    engine.save_16bit_model(ckpt, "model.pt")
    engine.save_checkpoint(ckpt)
    saved = digest(torch.load(os.path.join(ckpt, "model.pt"))) if torch.distributed.get_rank() == 0 else None
    result = {"model_16bit": saved, "trained_on": steps(engine, micro_batches[1:])}
    engine.destroy()
    fresh = new_engine()
    fresh.load_checkpoint(ckpt)
    result["resumed"] = steps(fresh, micro_batches[2:])
    fresh.destroy()
    return result


def latest_checkpoint(mode, device, nvme, ckpt):
    """TestLatestCheckpoint (stage 3, fp32): ``test_missing_latest``, a load from a folder with no ``latest`` file (a
    script's first run) returns no path and changes nothing, and the engine trains on; ``test_existing_latest``, a
    save and a load with no tag go through ``latest`` (the tag ``global_step2``), and the new engine trains on. The
    paths returned, the losses and the trained weights."""
    def new_engine():
        torch.manual_seed(1234)
        model = Layers(2, False)
        return deepspeed.initialize(config=ds_config(mode, device, nvme, 2, 1), model=model,
                                    model_parameters=model.parameters())[0]

    def steps(engine, seed):
        return {"losses": recorded(engine, batches(2, 2, seed=seed)), "trained": digest(gathered(engine))}

    os.makedirs(ckpt, exist_ok=True)
    engine = new_engine()
    missing_path, _client_state = engine.load_checkpoint(ckpt)
    result = {"missing": dict(steps(engine, seed=3), path=missing_path)}
    engine.save_checkpoint(ckpt)
    engine.destroy()
    fresh = new_engine()
    loaded_path, _client_state = fresh.load_checkpoint(ckpt)
    result["existing"] = dict(steps(fresh, seed=5), path=os.path.relpath(loaded_path, ckpt))
    fresh.destroy()
    uninterrupted = new_engine()
    steps(uninterrupted, seed=3)
    result["uninterrupted"] = steps(uninterrupted, seed=5)
    uninterrupted.destroy()
    return result


def reads_issued(engine, mode):
    """The optimizer's reads started ahead so far (tencache's stats; None under stock)."""
    return tencache_ds.stats(engine)["optimizer_cache_prefetch_issued"] if mode.startswith("tencache") else None


def loads_params_beyond_max_in_cpu(mode, device, nvme, ckpt):
    """Not a port: loads without the optimizer's state (``load_optimizer_states=False``, and ``load_module_only``)
    with the parameters on NVMe beyond ``offload_param.max_in_cpu`` (configs/stock-nvme.json sets it to 0), which
    stage 3 cannot finish: it sets the fp32 masters from flat 16-bit partitions such parameters do not have
    (``'NoneType' object has no attribute 'data'``, half-loaded, with the optimizer on cpu or NVMe; tencache refused
    the module-only load and kept the checkpoint's masters at the other). In bf16 (where masters set from the
    loaded 16-bit weights differ from the saved fp32 ones), with the optimizer on ``device`` and on cpu: train a
    step, save, train a step more, load, and train 3 steps. Under stock the parameters are offloaded to cpu (the
    reference: stock CPU offload). Each load's ``loads_and_trains_on``, by optimizer device and load."""
    result = {}
    for optimizer_device in dict.fromkeys((device, "cpu")):
        for load in ("module", "weights"):
            folder = os.path.join(nvme, optimizer_device, load)
            config = ds_config(mode, optimizer_device, folder, 2, 1, bf16=True, params_too=True)
            if mode.startswith("tencache"):
                config["zero_optimization"]["offload_param"] = {
                    "device": "nvme", "nvme_path": folder, "pin_memory": False, "buffer_count": 8,
                    "buffer_size": 2_000_000, "max_in_cpu": 1000}
            torch.manual_seed(1234)
            model = Layers(2, False)
            engine, *_ = deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())
            saved = os.path.join(ckpt, optimizer_device, load)
            train(engine, 1, 2, torch.bfloat16)
            engine.save_checkpoint(saved, tag="saved")
            train(engine, 1, 2, torch.bfloat16)
            result[f"{optimizer_device}_{load}"] = loads_and_trains_on(engine, saved, load)
            engine.destroy()
    return result


def load_into_reordered_model(mode, device, nvme, ckpt):
    """Not a port: a checkpoint loaded without its optimizer's state by a model whose parameters are registered in
    another order, with the same names and shapes (helper-192: the masters' files, placed by position, undid the
    module's load by name, and the model trained on from scrambled weights). In bf16: train 2 steps and save; a
    fresh engine of the reordered model loads the weights and trains 3 steps (``loads_and_trains_on``)."""
    config = ds_config(mode, device, os.path.join(nvme, "saving"), 2, 1, bf16=True)
    torch.manual_seed(1234)
    model = Layers(2, False)
    engine, *_ = deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())
    train(engine, 2, 2, torch.bfloat16)
    engine.save_checkpoint(ckpt, tag="saved")
    saved = digest(gathered(engine))
    engine.destroy()
    config = ds_config(mode, device, os.path.join(nvme, "loading"), 2, 1, bf16=True)
    torch.manual_seed(99)
    model = LayersReordered(2, False)
    engine, *_ = deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())
    result = loads_and_trains_on(engine, ckpt, "weights")
    engine.destroy()
    return dict(result, saved=saved)


def other_world_engine(mode, device, nvme, sub_group_size=None, universal=False, lr=1e-3, bf16=False):
    torch.manual_seed(1234)
    model = Layers(3, False)
    config = ds_config(mode, device, nvme, 2, 1, lr=lr, bf16=bf16)
    if sub_group_size:
        config["zero_optimization"]["sub_group_size"] = sub_group_size
    if universal:
        config["checkpoint"] = {"load_universal": True}
    return deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())[0]


def fresh_engines_load(mode, device, nvme, saved, sub_group_size=None, tag="saved", loads=("weights", "optimizer"),
                       lr=1e-3, bf16=False):
    """Fresh engines (learning rate ``lr``, in bf16 if ``bf16``) load the checkpoint ``tag`` in ``saved`` (a
    universal one: ``tag`` "universal"), one without the optimizer's state ("weights"), one with it ("optimizer"),
    one the module only ("module", if in ``loads``), and each trains 3 steps: ``loads_and_trains_on`` of each."""
    result = {}
    for load in loads:
        engine = other_world_engine(mode, device, os.path.join(nvme, tag, load), sub_group_size,
                                    universal=tag == "universal", lr=lr, bf16=bf16)
        result[load] = loads_and_trains_on(engine, saved, load, tag)
        engine.destroy()
    return result


def loads_and_trains_on(engine, saved, load, tag="saved"):
    """``engine`` loads the checkpoint ``tag`` in ``saved``: the optimizer's state with it (``load`` "optimizer"),
    not ("weights"), or the module only ("module"), then trains 3 steps. The load's error, or the loaded weights, the
    losses and the trained weights."""
    try:
        engine.load_checkpoint(saved, tag=tag, load_optimizer_states=load == "optimizer",
                               load_lr_scheduler_states=False, load_module_only=load == "module")
    except Exception as err:  # the error itself is the result
        return {"error": f"{type(err).__name__}: {err}"}
    return dict(loaded=digest(gathered(engine)), **trains_on(engine))


def trains_on(engine):
    """Train ``engine`` 3 steps (the batches a load trains on after, in its dtype): the losses and the trained
    weights."""
    losses = []
    for x, y in batches(3, 2, seed=11, dtype=torch.bfloat16 if engine.bfloat16_enabled() else torch.float32):
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss)
    return {"losses": digest({f"{i}": loss for i, loss in enumerate(losses)}), "trained": digest(gathered(engine))}


def save_for_other_world_size(mode, device, nvme, ckpt):
    """The first half of TestZeROCheckpoint's elastic cases (DeepSpeed's stage-3 answer: not supported), not a
    port, in bf16 (so that a load that rounded the fp32 masters to the bf16 weights shows): train 2 steps and save,
    at this launch's world size; ``load_at_other_world_size`` loads it at another.
    Then, in this launch, a fresh engine with other sub-groups (``sub_group_size`` a layer's weight instead of one
    sub-group) loads it with the optimizer's state (stock CPU offload stops: other parameter groups) and without it
    (the weights are the checkpoint's: train 3 steps on)."""
    engine = other_world_engine(mode, device, nvme, bf16=True)
    train(engine, 2, 2, torch.bfloat16)
    engine.save_checkpoint(ckpt, tag="saved")
    result = {"trained": digest(gathered(engine))}
    engine.destroy()
    other_sub_groups = fresh_engines_load(mode, device, nvme, ckpt, sub_group_size=HIDDEN * HIDDEN, bf16=True)
    return dict(result, **{f"other_sub_groups_{load}": loaded for load, loaded in other_sub_groups.items()})


def load_saved_on_cpu(mode, device, nvme, ckpt):
    """Not a port: a checkpoint saved with the optimizer offloaded to cpu (a user who ran out of memory and moves it
    to NVMe) loaded with the optimizer on ``device``, with its state and without it, each by a fresh engine that
    then trains 3 steps; and the saving engine's own next 3 steps ("uninterrupted"). Its ZeRO file holds the
    optimizer's state; the NVMe load path reads swap files only. A sub-group per layer (``sub_group_size`` a layer's
    weight). Then both loads by engines with other sub-groups (one: stock CPU offload refuses the optimizer's
    state)."""
    engine = other_world_engine("stock", "cpu", nvme, sub_group_size=HIDDEN * HIDDEN)
    train(engine, 2, 2)
    engine.save_checkpoint(ckpt, tag="saved")
    uninterrupted = trains_on(engine)
    engine.destroy()
    return dict(fresh_engines_load(mode, device, nvme, ckpt, sub_group_size=HIDDEN * HIDDEN),
                uninterrupted=uninterrupted, other_sub_groups=fresh_engines_load(mode, device, nvme, ckpt))


def saved_on_nvme(mode, device, nvme, ckpt):
    """Not a port, in two launches. With the optimizer on NVMe (tencache's launch, first): train 2 steps, save, and
    train 3 more ("uninterrupted"). With it on cpu (stock's launch, after: a process that never imported tencache_ds,
    as a user who moves a run to a machine with more memory): fresh engines load that checkpoint (``CKPT_DIR``'s
    sibling ``ckpt-tencache-nvme``), without the optimizer's state and with it (the moments are in its swap files
    only: the ZeRO file describes them without bytes), and with it from the copy ``tencache-ds checkpoint-for-cpu``
    converted (``saved_on_nvme_for_cpu`` beside it: the test makes it between the launches), each training 3 steps.
    A sub-group per layer."""
    if device == "nvme":
        engine = other_world_engine(mode, device, nvme, sub_group_size=HIDDEN * HIDDEN)
        train(engine, 2, 2)
        engine.save_checkpoint(ckpt, tag="saved")
        trained = digest(gathered(engine))
        uninterrupted = trains_on(engine)
        engine.destroy()
        return {"trained": trained, "uninterrupted": uninterrupted}
    saved = os.path.join(os.path.dirname(os.path.dirname(ckpt)), "ckpt-tencache-nvme", "saved_on_nvme")
    engine = other_world_engine(mode, device, os.path.join(nvme, "converted"), sub_group_size=HIDDEN * HIDDEN)
    converted = loads_and_trains_on(engine, saved + "_for_cpu", "optimizer")
    engine.destroy()
    return dict(fresh_engines_load(mode, device, nvme, saved, sub_group_size=HIDDEN * HIDDEN), converted=converted)


def load_at_other_world_size(mode, device, nvme, ckpt):
    """The second half, in a launch of another world size: a fresh engine loads ``save_for_other_world_size``'s
    checkpoint with the optimizer's state (stock CPU offload stops: ZeRO-3 cannot repartition it) and without it
    (the weights are the checkpoint's, repartitioned: train 3 steps on). With the optimizer on NVMe stock copies the
    other world size's swap files in and stops at the first swap-in. Then the same two loads of its universal
    version (tag "universal": ``ds_to_universal``'s output, which the test makes between the launches), DeepSpeed's
    way to another world size, and of the module only, by engines with a sub-group per layer and another learning
    rate (the checkpoint's is loaded with its optimizer state)."""
    saved = os.path.join(os.path.dirname(ckpt), "save_for_other_world_size")
    return dict(fresh_engines_load(mode, device, nvme, saved, bf16=True),
                universal=fresh_engines_load(mode, device, nvme, saved, sub_group_size=HIDDEN * HIDDEN,
                                             tag="universal", loads=("weights", "optimizer", "module"), lr=5e-4,
                                             bf16=True))


def tag_validation(mode, device, nvme, ckpt):
    """test_tag_validation.py (TestCheckpointValidationTag), trained: each rank saves under a tag of its own
    (``tag-RANK``). With ``"tag_validation": "FAIL"`` the save stops with stock's AssertionError on every rank, before
    any file is written, and the engine trains on; with ``"WARN"`` each rank saves into its tag's folder and the
    engine trains on. An unknown mode stops ``deepspeed.initialize`` with DeepSpeedConfigError. The errors, the
    files each tag's folder got, the losses and the trained weights."""
    def new_engine(validation):
        config = dict(ds_config(mode, device, os.path.join(nvme, validation), 2, 1),
                      checkpoint={"tag_validation": validation})
        torch.manual_seed(1234)
        model = Layers(2, False)
        return deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())[0]

    def files_under(folder):
        return sorted((os.path.relpath(os.path.join(root, name), folder), os.path.getsize(os.path.join(root, name)))
                      for root, _, names in os.walk(folder) for name in names)

    rank, result = torch.distributed.get_rank(), {}
    for validation in ("FAIL", "WARN"):
        engine, folder = new_engine(validation), os.path.join(ckpt, validation)
        before = recorded(engine, batches(2, 2, seed=3))
        if validation == "FAIL":
            # both tags saved whole first, by every rank (the ranks then disagree on which to save into: "best" and
            # "last" chosen from each rank's own loss): the refused save leaves them as they were, and they load
            # (helper-243's review: it removed each rank's swap files of its tag before the engine refused it)
            for agreed in ("tag-0", "tag-1"):
                engine.save_checkpoint(folder, tag=agreed)
        files_before = files_under(folder)
        try:
            engine.save_checkpoint(folder, tag=f"tag-{rank}")
            refused = False
        except AssertionError as err:
            refused = "not consistent across all ranks" in str(err)
        torch.distributed.barrier()
        tag_folder = os.path.join(folder, f"tag-{rank}")
        result[validation] = {
            "refused": refused, "written": files_under(folder) != files_before,
            "own_zero_file": os.path.exists(
                os.path.join(tag_folder, f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")),
            "losses": [before, recorded(engine, batches(2, 2, seed=5))], "trained": digest(gathered(engine))}
        if validation == "FAIL":
            for agreed in ("tag-0", "tag-1"):
                engine.load_checkpoint(folder, tag=agreed)
                result[validation][f"loaded_{agreed}"] = digest(gathered(engine))
        engine.destroy()
    try:
        new_engine("foo")
        result["unknown"] = None
    except deepspeed.DeepSpeedConfigError as err:
        result["unknown"] = type(err).__name__
    return result


def integer_tag(mode, device, nvme, ckpt):
    """Not upstream: ``save_checkpoint(dir, tag=step)`` with an integer (the save names the folder ``str(tag)``)
    and a load of it by the same integer, as stock CPU offload loads it; training after the load goes on from the
    checkpoint. With the optimizer on NVMe the load stopped part way on a TypeError (stage 3's copy of the swap folder
    joined the tag itself; stock NVMe too: helper-243's review)."""
    torch.manual_seed(1234)
    model = Layers(2, False)
    engine, *_ = deepspeed.initialize(config=ds_config(mode, device, nvme, 2, 1), model=model,
                                      model_parameters=model.parameters())
    first = recorded(engine, batches(2, 2, seed=3))
    engine.save_checkpoint(ckpt, tag=7)
    recorded(engine, batches(2, 2, seed=5))
    engine.load_checkpoint(ckpt, tag=7)
    # the weights loaded and the next loss (the updates after a load with the optimizer's state are the
    # uninterrupted run's under tencache, not stock CPU offload's: its resume misses Adam's beta products;
    # docs/reliability.md, "Resume: exact under tencache, not in stock")
    result = {"first": first, "loaded": digest(gathered(engine)), "after": recorded(engine, batches(1, 2, seed=5))}
    engine.destroy()
    return result


# (parameters, optimizer) offload devices of TestNVMeCheckpointing; the reference's launch (device "cpu") runs each
# with "nvme" replaced by "cpu"
NVME_CHECKPOINTING = (("none", "nvme"), ("cpu", "nvme"), ("nvme", "none"), ("nvme", "cpu"), ("nvme", "nvme"))


def nvme_checkpointing(mode, device, nvme, ckpt):
    """test_nvme_checkpointing.py (TestNVMeCheckpointing), in bf16 and at 2 ranks: for each placement of the
    parameters and the optimizer on NVMe, cpu or neither (``NVME_CHECKPOINTING``), with ``sub_group_size`` 100 and
    ``stage3_max_live_parameters`` 100 (a sub-group per parameter, nothing kept gathered): train 2 steps, save,
    train 2 more and take the loss of a last batch; a fresh engine loads the checkpoint, trains the same 2 steps and
    takes the same loss. The losses, both last losses (upstream: equal) and the trained weights."""
    placements = {}
    for params, optimizer in NVME_CHECKPOINTING:
        def placed(where):
            return "cpu" if device == "cpu" and where == "nvme" else where

        name = f"params={params},optimizer={optimizer}"
        config = ds_config(mode, placed(optimizer), os.path.join(nvme, name), 1, 1, bf16=True)
        if optimizer == "none":
            del config["zero_optimization"]["offload_optimizer"]
        if params != "none":
            config["zero_optimization"]["offload_param"] = {"device": placed(params), "pin_memory": False}
            if placed(params) == "nvme":
                config["zero_optimization"]["offload_param"].update(nvme_path=os.path.join(nvme, name),
                                                                      buffer_count=6, buffer_size=2_000_000)
        config["zero_optimization"].update(sub_group_size=100, stage3_max_live_parameters=100)

        def new_engine():
            torch.manual_seed(123)
            with deepspeed.zero.Init(config_dict_or_path=config):
                model = Layers(2, False)
            return deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())[0]

        def second_stage_and_last_loss(engine):
            losses = recorded(engine, batches(2, 1, seed=5, dtype=torch.bfloat16))
            [(x, y)] = batches(1, 1, seed=9, dtype=torch.bfloat16)
            return losses, engine(x, y)

        engine = new_engine()
        engine.empty_partition_cache()
        first = recorded(engine, batches(2, 1, seed=3, dtype=torch.bfloat16))
        engine.save_checkpoint(os.path.join(ckpt, name))
        second, last_before = second_stage_and_last_loss(engine)
        trained = digest(gathered(engine))
        engine.destroy()
        engine = new_engine()
        engine.load_checkpoint(os.path.join(ckpt, name))
        resumed, last_after = second_stage_and_last_loss(engine)
        placements[name] = {"losses": [first, second, resumed],
                            "last": digest({"before": last_before, "after": last_after}),
                            "equal": bool(torch.equal(last_before, last_after)),
                            "trained": [trained, digest(gathered(engine))]}
        engine.destroy()
    return {"placements": placements}


SCENARIOS = {
    "zero_to_fp32": lambda *args: zero_to_fp32(*args, freeze=False),
    "zero_to_fp32_frozen": lambda *args: zero_to_fp32(*args, freeze=True),
    "zero_to_fp32_frozen_params_offloaded": lambda *args: zero_to_fp32(*args, freeze=True, params_too=True),
    "immediate_save_load": immediate_save_load,
    "load_immediate_save": load_immediate_save,
    "load_into_new_engine": load_into_new_engine,
    "loss_scale_restored": loss_scale_restored,
    "load_saved_before_any_step": load_saved_before_any_step,
    "load_into_trained_engine": load_into_trained_engine,
    "load_after_a_backward_without_its_step": load_after_a_backward_without_its_step,
    "save_before_accumulation_is_done": save_before_accumulation_is_done,
    "latest_checkpoint": latest_checkpoint,
    "tag_validation": tag_validation,
    "integer_tag": integer_tag,
    "nvme_checkpointing": nvme_checkpointing,
    "loads_params_beyond_max_in_cpu": loads_params_beyond_max_in_cpu,
    "load_into_reordered_model": load_into_reordered_model,
    "save_for_other_world_size": save_for_other_world_size,
    "load_at_other_world_size": load_at_other_world_size,
    "load_saved_on_cpu": load_saved_on_cpu,
    "saved_on_nvme": saved_on_nvme,
}


def main(scenarios, mode, device, nvme, ckpt):
    run_scenarios([(scenario, functools.partial(SCENARIOS[scenario], mode, device, os.path.join(nvme, scenario),
                                                os.path.join(ckpt, scenario)))
                   for scenario in scenarios.split(",")])


if __name__ == "__main__":
    main(*ARGS[:5])
