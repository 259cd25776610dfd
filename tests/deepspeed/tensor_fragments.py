"""Our versions of DeepSpeed's tensor-fragment tests, with the optimizer offloaded (our code, written after the
scenarios of tests/unit/runtime/zero/test_zero_tensor_fragment.py in DeepSpeed's repository: TestTensorFragmentGet,
TestTensorFragmentSet, TestTensorFragmentUpdate; and of test_zero_grad_clip.py; ZeRO-3, 2 ranks, fp32 and bf16
instead of fp16, the CPU accelerator, layers of 1024 so that the optimizer state is large enough to be swapped, the
first layer frozen). These are the calls users make to read and change what ZeRO-3 partitions: the fp32 weights, the gradients after
backward and Adam's moments after the step, whole (``safe_*_full_*``) or this rank's part (``safe_*_local_*``).
Rank 0 prints one RESULT line.

    deepspeed --num_gpus 2 tests/deepspeed/tensor_fragments.py SCENARIOS stock|tencache[=BUDGETS] nvme|cpu NVME_DIR

SCENARIOS: comma-separated, of get_, set_, update_, clip_, save16_, missing_, fresh_, set_params_, clip_params_ +
fp32 or bf16 (test_zero_grad_clip.py's custom clipping for clip; the 16-bit model file saved with the parameters
offloaded too for save16, and set and clip so in set_params and clip_params; a state key the optimizer lacks asked
for first, for missing; gradients read and set before the first backward, for fresh); they run one after
the other in the same processes, each with its own engine and folder under NVME_DIR. ``tencache=BUDGETS``:
comma-separated values of the block's ``host_cache_bytes`` ("auto" without any), each running every scenario (its
results under "SCENARIO@BUDGET"). A scenario's result holds
SHA-256 sums of what the calls returned and of the weights training ends with (so that runs compare bit for bit),
and whether each value set was read back as set; where it fails, its error (the scenarios after it do not run).
"""
import contextlib
import functools
import os
import sys

import torch

from scenarios import digest, gathered, run_scenarios  # tests/deepspeed/scenarios.py

ARGS = [arg for arg in sys.argv[1:] if not arg.startswith("--local_rank")]  # the launcher adds --local_rank=N
if ARGS[1].startswith("tencache"):
    import tencache_ds  # noqa: F401  (installs the swappers; DeepSpeed is imported already where forked)
import deepspeed  # noqa: E402
from deepspeed.utils import (safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,  # noqa: E402
                             safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state,
                             safe_set_full_fp32_param, safe_set_full_grad, safe_set_full_optimizer_state,
                             safe_set_local_fp32_param, safe_set_local_grad, safe_set_local_optimizer_state,
                             safe_update_full_grad_vectorized)

HIDDEN = 1024
MOMENTS = ("exp_avg", "exp_avg_sq")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


ON_FILE = "on_file"  # params_too: the parameters offloaded, and on NVMe each partition on file between its uses


def ds_config(budget, device, nvme, dtype, params_too=False):
    offload = {"device": device, "pin_memory": False}
    if device == "nvme":
        offload.update(nvme_path=nvme, buffer_count=4)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1000000,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "offload_optimizer": offload},
              "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                      "overlap_events": True}}
    if params_too:  # the parameters offloaded as well, and gathered whole into the 16-bit model file at a save
        config["zero_optimization"]["offload_param"] = dict(offload, buffer_count=6, buffer_size=2_000_000)
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
        if params_too == ON_FILE:  # none kept in a flat CPU buffer of stage 3's (at its default 1e9, all of them)
            config["zero_optimization"]["offload_param"]["max_in_cpu"] = 0
    if dtype == torch.bfloat16:
        config["bf16"] = {"enabled": True}
    if budget is not None:  # tencache's
        config["tencache"] = {"host_cache_bytes": budget}
    return config


class Layers(torch.nn.Module):
    """Three square linear layers, the first frozen (its fragments read as None)."""

    def __init__(self):
        super().__init__()
        self.ll = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.ll[0].weight.requires_grad = False
        self.ll[0].bias.requires_grad = False
        self.cross_entropy_loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, y):
        for layer in self.ll:
            x = torch.relu(layer(x))
        return self.cross_entropy_loss(x.float(), y)


def batches(count, dtype):
    generator = torch.Generator().manual_seed(7 + torch.distributed.get_rank())
    for _ in range(count):
        yield (torch.randn(2, HIDDEN, generator=generator).to(dtype),
               torch.randint(0, HIDDEN, (2,), generator=generator))


@contextlib.contextmanager
def engine_for(budget, device, nvme, dtype, params_too=False):
    """A fresh engine for one scenario, destroyed at the end (ZeRO-3 leaks its hooks otherwise)."""
    torch.manual_seed(1234)
    config = ds_config(budget, device, nvme, dtype, params_too)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = Layers()
    engine, *_ = deepspeed.initialize(config=config, model=model, model_parameters=model.parameters())
    try:
        yield engine
    finally:
        engine.destroy()


def random_like(shape, seed, dtype=torch.float32):
    """The same values on every rank for the same seed (what the full setters require)."""
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def trained(engine, dtype, after_backward, after_step, steps=3):
    """Train ``steps`` steps, calling ``after_backward(engine, step)`` between backward and step and
    ``after_step(engine, step)`` after it; returns what they returned and the final weights' digest."""
    seen = {}
    for step, (x, y) in enumerate(batches(steps, dtype)):
        engine.backward(engine(x, y))
        seen[f"after_backward_{step}"] = after_backward(engine, step)
        engine.step()
        seen[f"after_step_{step}"] = after_step(engine, step)
    seen["weights"] = digest(gathered(engine))
    return seen


def get(budget, device, nvme, dtype):
    """TestTensorFragmentGet: every getter, full and local, after backward and after the step (the gradients too,
    which stock CPU offload's update has unscaled and clipped in place by then)."""
    def after_backward(engine, _step):
        values = {}
        for name, lp in engine.module.named_parameters():
            values[f"{name}.full_fp32"] = safe_get_full_fp32_param(lp)
            values[f"{name}.full_grad"] = safe_get_full_grad(lp)
            values[f"{name}.local_fp32"] = safe_get_local_fp32_param(lp)
            values[f"{name}.local_grad"] = safe_get_local_grad(lp)
        return _by_getter(engine, values)

    def after_step(engine, _step):
        values = {}
        for name, lp in engine.module.named_parameters():
            for key in MOMENTS:
                values[f"{name}.full_{key}"] = safe_get_full_optimizer_state(lp, key)
                values[f"{name}.local_{key}"] = safe_get_local_optimizer_state(lp, key)
            values[f"{name}.full_grad"] = safe_get_full_grad(lp)
            values[f"{name}.local_grad"] = safe_get_local_grad(lp)
        return _by_getter(engine, values)

    with engine_for(budget, device, nvme, dtype) as engine:
        return trained(engine, dtype, after_backward, after_step)


def missing(budget, device, nvme, dtype):
    """A state key the optimizer does not have, asked for first, as generic code does (SGD's "momentum_buffer", then
    Adam's "exp_avg"), whole and this rank's part, after every step, read and then set, and where it lives
    (get_hp_param_device, offload_states' question): stage 3's getter and setter raise KeyError after their swap-in,
    before their release or swap-out. After every backward, a vectorised gradient update whose function raises at
    the third trained parameter, once the first two of the sub-group have their new gradients. Training goes on, the
    key it has reads and sets as always, and the gradients written before the raise are the step's (until
    2026-12-03 tencache left the sub-group lent and the next swap-in or flush stopped on it; stock NVMe stops on an
    empty buffer list)."""
    def after_backward(engine, _step):
        trained_params = [lp for lp in engine.module.parameters() if lp.requires_grad]

        def halved_until_the_third(gradient, lp):
            if lp is trained_params[2]:
                # first the gradient of a parameter of the sub-group being updated, as a function that looks at
                # others does: stock CPU offload returns it; with the sub-group lent, tencache refuses it (a
                # RuntimeError; stock NVMe stops on the gradient stage 3 set to None on the inner release)
                safe_get_full_grad(trained_params[0])
                raise ValueError("the user's update function fails here")
            return gradient * 0.5

        try:
            safe_update_full_grad_vectorized(trained_params, halved_until_the_third)
            raised = False
        except (ValueError, RuntimeError):
            raised = True
        return {"update_raised": raised,
                "grads": digest({str(index): safe_get_full_grad(lp) for index, lp in enumerate(trained_params)})}

    def after_step(engine, _step):
        values, missed, devices = {}, 0, set()
        for name, lp in engine.module.named_parameters():
            for scope, getter in (("full", safe_get_full_optimizer_state), ("local", safe_get_local_optimizer_state)):
                for key in ("momentum_buffer", "exp_avg"):
                    try:
                        value = getter(lp, key)
                    except KeyError:
                        missed += 1
                        continue
                    # as read: stock CPU offload's local getter returns a view of the state the setters change below
                    values[f"{name}.{scope}_{key}"] = None if value is None else value.clone()
            if lp.requires_grad:  # the setters too: the missing key first, then the one it has, set to 0.5
                for scope, setter, shape in (("full", safe_set_full_optimizer_state, lp.ds_shape),
                                             ("local", safe_set_local_optimizer_state, lp.ds_tensor.shape)):
                    value = torch.full(shape, 0.5)
                    for key in ("momentum_buffer", "exp_avg"):
                        try:
                            setter(lp, value, key)
                        except KeyError:
                            missed += 1
            for key in ("momentum_buffer", "exp_avg"):
                try:
                    devices.add(str(engine.optimizer.get_hp_param_device(lp, key)))
                except KeyError:
                    missed += 1
        return {**_by_getter(engine, values), "missed": missed, "devices": sorted(devices)}

    with engine_for(budget, device, nvme, dtype) as engine:
        return trained(engine, dtype, after_backward, after_step)


def fresh(budget, device, nvme, dtype):
    """Before the first backward, as a user's start-up code or a callback that runs first calls them: the gradient
    getters, whole and this rank's part, read stock CPU offload's zeros (the buffer it allocates at init); a
    vectorised update whose function raises at the third trained parameter keeps what it wrote before (stock writes
    in place), then one that runs through; a gradient set, whole and local, reads back as set. Then training,
    whose first backward overwrites what was set (stock's copy at the first micro-batch). With the optimizer on NVMe
    a sub-group has no gradient until then, and each of these calls stopped on None (AttributeError in stage 3,
    stock NVMe too; tencache until 2026-12-07: helper-240's review), and then the raising update's fragments were
    dropped (helper-242's)."""
    with engine_for(budget, device, nvme, dtype) as engine:
        params = [(name, lp) for name, lp in engine.module.named_parameters() if lp.requires_grad]
        seen = {"read": _by_getter(engine, {key: value for name, lp in engine.module.named_parameters()
                                            for key, value in ((f"{name}.full_grad", safe_get_full_grad(lp)),
                                                               (f"{name}.local_grad", safe_get_local_grad(lp)))})}

        def ones_until_the_third(gradient, lp):
            if lp is params[2][1]:
                raise ValueError("the user's update function fails here")
            return gradient + 1.0

        try:
            safe_update_full_grad_vectorized([lp for _, lp in params], ones_until_the_third)
        except ValueError:
            seen["raised_update"] = digest({name: safe_get_full_grad(lp) for name, lp in params})
        offsets = {id(lp): index + 1.0 for index, (_, lp) in enumerate(params)}
        safe_update_full_grad_vectorized([lp for _, lp in params], lambda gradient, lp: gradient + offsets[id(lp)])
        seen["updated"] = digest({name: safe_get_full_grad(lp) for name, lp in params})
        matches = True
        for index, (name, lp) in enumerate(params):
            if index % 2 == 0:
                value = random_like(lp.ds_shape, index, dtype)
                safe_set_full_grad(lp, value)
                matches &= bool(torch.equal(safe_get_full_grad(lp).to(dtype), value))
            else:
                value = random_like((lp.ds_tensor.ds_numel,), index + 100 * (torch.distributed.get_rank() + 1), dtype)
                safe_set_local_grad(lp, value)
                matches &= bool(torch.equal(safe_get_local_grad(lp).to(dtype), value))
        seen["set_read_back"] = matches
        return {**seen, **trained(engine, dtype, lambda _engine, _step: None, lambda _engine, _step: None)}


def _by_getter(engine, values):
    """A digest per getter ("full_fp32", "local_grad", ...: what follows the parameter's name) and whether frozen
    parameters read as None."""
    getters = {key.rsplit(".", 1)[1] for key in values}
    found = {getter: digest({key: value for key, value in values.items() if key.endswith("." + getter)})
             for getter in sorted(getters)}
    return {**found, "frozen_none": _frozen_none(engine, values)}


def _frozen_none(engine, values):
    """Frozen parameters read as None, trained ones as tensors."""
    frozen = {name for name, lp in engine.module.named_parameters() if not lp.requires_grad}
    return all((values[key] is None) == (key.split(".full_")[0].split(".local_")[0] in frozen) for key in values)


def set_(budget, device, nvme, dtype, params_too=False):
    """TestTensorFragmentSet: set weights and gradients after backward, weights and moments after the step, full at
    even steps and local at odd ones; each value is read back as set, and training on uses them. ``params_too``:
    the parameters offloaded as well (on NVMe a partition on file holds a one-element placeholder, by whose size
    stage 3's local setters checked the value: helper-195)."""
    def put(engine, step, keys):
        matches = True
        rank = torch.distributed.get_rank()
        for index, (name, lp) in enumerate(engine.module.named_parameters()):
            if not lp.requires_grad:
                continue
            for number, key in enumerate(keys):
                seed = 1000 * step + 10 * index + number
                if step % 2 == 0:
                    value = random_like(lp.ds_shape, seed, dtype if key == "grad" else torch.float32)
                    setter, getter = {"weight": (safe_set_full_fp32_param, safe_get_full_fp32_param),
                                      "grad": (safe_set_full_grad, safe_get_full_grad)}.get(
                        key, (lambda p, v, k=key: safe_set_full_optimizer_state(p, v, k),
                              lambda p, k=key: safe_get_full_optimizer_state(p, k)))
                else:  # this rank's part: different values on each rank
                    value = random_like((lp.ds_tensor.ds_numel,), seed + 100_000 * (rank + 1),
                                        dtype if key == "grad" else torch.float32)
                    setter, getter = {"weight": (safe_set_local_fp32_param, safe_get_local_fp32_param),
                                      "grad": (safe_set_local_grad, safe_get_local_grad)}.get(
                        key, (lambda p, v, k=key: safe_set_local_optimizer_state(p, v, k),
                              lambda p, k=key: safe_get_local_optimizer_state(p, k)))
                setter(lp, value)
                matches &= bool(torch.equal(getter(lp).to(value.dtype), value))
        return matches

    with engine_for(budget, device, nvme, dtype, params_too) as engine:
        return trained(engine, dtype, lambda engine, step: put(engine, step, ("weight", "grad")),
                       lambda engine, step: put(engine, step, ("weight",) + MOMENTS))


def update(budget, device, nvme, dtype):
    """TestTensorFragmentUpdate: new gradients through safe_update_full_grad_vectorized after backward; read back
    as given, and the step uses them."""
    def after_backward(engine, step):
        params = [lp for lp in engine.module.parameters() if lp.requires_grad]
        new = {id(lp): random_like(lp.ds_shape, 10 * step + index, dtype) for index, lp in enumerate(params)}
        safe_update_full_grad_vectorized(params, lambda _old, lp: new[id(lp)])
        return all(torch.equal(safe_get_full_grad(lp).to(dtype), new[id(lp)]) for lp in params)

    with engine_for(budget, device, nvme, dtype) as engine:
        return trained(engine, dtype, after_backward, lambda _engine, _step: None)


def clip(budget, device, nvme, dtype, params_too=False):
    """test_zero_grad_clip.py: a user's own clipping after backward, each rank clamping its part of every gradient
    (safe_get_local_grad, safe_set_local_grad); stage 3's gradient norm falls, and the step uses the clamped
    gradients. ``params_too``: as in ``set_``."""
    def after_backward(engine, _step):
        optimizer = engine.optimizer
        before = torch.linalg.vector_norm(torch.stack(optimizer._get_norm_groups()))
        for lp in engine.module.parameters():
            gradient = safe_get_local_grad(lp)
            if gradient is not None:
                safe_set_local_grad(lp, torch.clamp(gradient, -1e-4, 1e-4))
        after = torch.linalg.vector_norm(torch.stack(optimizer._get_norm_groups()))
        return {"norms": digest({"before": before, "after": after}), "fell": bool(after < before)}

    with engine_for(budget, device, nvme, dtype, params_too) as engine:
        return trained(engine, dtype, after_backward, lambda _engine, _step: None)


def save16(budget, device, nvme, dtype):
    """The 16-bit model a training run saves at its end (engine.save_16bit_model, and the consolidated state dict
    under it, which Hugging Face's Trainer saves with stage3_gather_16bit_weights_on_model_save), the parameters
    offloaded as well: every parameter gathered whole outside the training step."""
    def after_step(engine, _step):
        state = engine._zero3_consolidated_16bit_state_dict()
        return digest(state) if torch.distributed.get_rank() == 0 else None

    with engine_for(budget, device, nvme, dtype, params_too=True) as engine:
        seen = trained(engine, dtype, lambda _engine, _step: None, after_step)
        folder = os.path.join(nvme, "saved")
        engine.save_16bit_model(folder)
        if torch.distributed.get_rank() == 0:
            seen["saved"] = digest(torch.load(os.path.join(folder, "pytorch_model.bin")))
        return seen


SCENARIOS = {f"{name}_{label}": (function, dtype)
             for name, function in (("get", get), ("set", set_), ("update", update), ("clip", clip),
                                    ("save16", save16), ("missing", missing), ("fresh", fresh),
                                    ("set_params", functools.partial(set_, params_too=ON_FILE)),
                                    ("clip_params", functools.partial(clip, params_too=ON_FILE)))
             for label, dtype in DTYPES.items()}


def main(scenarios, mode, device, nvme):
    budgets = [None] if mode == "stock" else (mode.partition("=")[2] or "auto").split(",")
    run_scenarios([(scenario if budget is None else f"{scenario}@{budget}",
                    functools.partial(SCENARIOS[scenario][0], budget, device,
                                      os.path.join(nvme, f"{scenario}@{budget}"), SCENARIOS[scenario][1]))
                   for budget in budgets for scenario in scenarios.split(",")])


if __name__ == "__main__":
    main(*ARGS[:4])
