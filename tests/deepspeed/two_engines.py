"""Two DeepSpeed engines in one process sharing one nvme_path (an RLHF actor and critic, say), trained in turns.

Stock DeepSpeed's second zero.Init deletes the first model's swap files (its constructor empties
<nvme_path>/zero_stage_3/<dtype>params/rank<r>). Prints one JSON line: the losses of each engine.
Usage: python two_engines.py NVME_PATH {tencache|tencache-mismatch|tencache-profiled|tencache-budget|stock}
    {both|first-only|one-init}
(tencache-mismatch: the second model's "tencache" block differs from the first's. tencache-profiled: a profile file
and a metrics file beside NVME_PATH, the second model's parameters in a folder of their own, and the result says where
each engine's optimizer and parameter profiles came from. tencache-budget: a 40 MiB host tier, and the result has
each engine's optimizer budget, its state's bytes and the parameter cache's. one-init: both models built in one
zero.Init context, an engine each; both train a step, the first engine is destroyed, the second trains on; the
second's trained weights are hashed too.)
"""
import hashlib
import json
import os
import sys

os.environ.setdefault("MASTER_PORT", "0")  # one process: the kernel chooses the store's port as it binds it
for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
    os.environ.setdefault(key, value)

import torch  # noqa: E402

nvme_path, mode, which = sys.argv[1:4]
if mode.startswith("tencache"):  # stock's runs, the references, in a process that never imported tencache_ds
    import tencache_ds  # noqa: E402,F401
import deepspeed  # noqa: E402

HIDDEN = 768  # 768 x 768 fp32 = 2.25 MiB: above DeepSpeed's 1 MiB swap threshold
config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                "stage3_max_reuse_distance": 0,
                                "offload_param": {"device": "nvme", "nvme_path": nvme_path, "max_in_cpu": 0,
                                                  "buffer_size": HIDDEN * HIDDEN},
                                "offload_optimizer": {"device": "nvme", "nvme_path": nvme_path}}}
if mode.startswith("tencache"):
    config["tencache"] = {"host_cache_bytes": 0}
if mode == "tencache-budget":
    config["tencache"]["host_cache_bytes"] = "40MiB"
if mode == "tencache-profiled":
    config["tencache"]["profile_path"] = os.path.join(os.path.dirname(nvme_path), "profile.json")
    config["tencache"]["metrics_path"] = os.path.join(os.path.dirname(nvme_path), "metrics.jsonl")


def build(seed):
    if mode == "tencache-mismatch" and seed == 2:
        config["tencache"] = {"host_cache_bytes": "64MiB"}
    if mode == "tencache-profiled" and seed == 2:  # its parameters in a folder of their own: a swapper of their own
        config["zero_optimization"]["offload_param"]["nvme_path"] = nvme_path + "-second"
    torch.manual_seed(seed)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(3)])
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def built_in_one_init():
    torch.manual_seed(1)
    with deepspeed.zero.Init(config_dict_or_path=config):
        models = [torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(3)])
                  for _ in range(2)]
    return {name: deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]
            for name, model in zip(("first", "second"), models)}


engines = built_in_one_init() if which == "one-init" else {"first": build(1)}
if which == "both":
    engines["second"] = build(2)
losses = {name: [] for name in engines}
if mode.startswith("tencache"):  # the run says it ran tencache's swappers (its losses are stock's bits)
    ran = {name: tencache_ds.stats(engine)["tencache_enabled"] for name, engine in engines.items()}
data = torch.Generator().manual_seed(3)
for step in range(3):
    batch = torch.randn(2, HIDDEN, generator=data)
    if which == "one-init" and step == 1:
        engines.pop("first").destroy()
    for name, engine in engines.items():
        loss = engine(batch).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses[name].append(loss.float().view(torch.int32).item())
if which == "one-init":  # and the trained fp32 weights of the engine that trained on (fp32 training: its masters')
    engine = engines["second"]
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        weights = torch.cat([param.detach().reshape(-1).float() for param in engine.module.parameters()])
        losses["second_weights_sha256"] = hashlib.sha256(weights.numpy().tobytes()).hexdigest()
if mode == "tencache-profiled":
    losses["optimizer_profiles"] = {name: tencache_ds.stats(engine)["optimizer_profile"]
                                    for name, engine in engines.items()}
    losses["param_profiles"] = {name: tencache_ds.stats(engine)["param_profile"] for name, engine in engines.items()}
if mode == "tencache-budget":
    from tencache_ds.integrations.deepspeed.stats import param_swapper_of
    losses["budgets"] = {name: [engine.optimizer.optimizer_swapper.budget.total_bytes,
                                engine.optimizer.optimizer_swapper.state_bytes()] for name, engine in engines.items()}
    losses["param_cache"] = param_swapper_of(engines["first"]).store.cache_bytes_reserved
if mode.startswith("tencache"):
    losses["tencache_ran"] = ran
print("RESULT " + json.dumps(losses), flush=True)
# Stock DeepSpeed's aio handles sometimes abort the interpreter's teardown ("terminate called without an active
# exception"); the run is over, so leave without it.
os._exit(0)
