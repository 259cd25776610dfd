"""An engine without an optimizer over a zero.Init model with its parameters on NVMe (a DPO trainer's reference
model, an evaluation engine): DeepSpeed gives it a ``DeepSpeedZeRoOffload`` as its optimizer. Three forward passes
without gradients, ``engine.destroy()`` (twice: stock tolerates it), then an engine with an optimizer over the same
model trains two steps. Prints one RESULT line: the losses, and tencache's swapper states after the destroy.

    python tests/deepspeed/optimizerless_engine.py stock|stock-cpu|tencache|tencache-streaming NVME_DIR [zero|convert] [PERSISTENCE]

``convert``: the model is built plainly, and the engine without an optimizer converts it (its parameter swapper is
made inside DeepSpeedZeRoOffload's constructor). ``stock-cpu``: stock with both offloads on cpu. ``PERSISTENCE``:
stage3_param_persistence_threshold (parameters up to it stay gathered once gathered).
"""
import json
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402
import deepspeed  # noqa: E402
from rebuild import config  # noqa: E402


def main(mode, nvme, init="zero", persistence=None):
    train.ensure_dist_env()
    deepspeed.init_distributed()
    stock = mode.startswith("stock")
    if not stock:
        import tencache_ds
    device = "cpu" if mode == "stock-cpu" else "nvme"
    cfg = config("stock" if stock else "tencache", nvme, device, device)
    if mode == "tencache-streaming":  # a host tier that holds no parameter partition beyond the streaming slots
        cfg["tencache"]["host_cache_bytes"] = 0
    if persistence is not None:
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = float(persistence)
    if init == "convert":  # (in fp32 the engine's conversion leaves the biases fp32 and the weights bf16, stock too)
        cfg["bf16"] = {"enabled": True}
    without_optimizer = json.loads(json.dumps(cfg))
    without_optimizer.pop("optimizer", None)
    without_optimizer["zero_optimization"].pop("offload_optimizer", None)
    _, model_cfg = train.load_model_config("gpt2-tiny")
    train.seed_everything(1234)
    model, _ = train.build_model(init, model_cfg, json.loads(json.dumps(cfg)))
    stream = train.synthetic_batches(model_cfg.vocab_size, 2, 64, 1)

    engine, *_ = deepspeed.initialize(model=model, config=without_optimizer)
    assert type(engine.optimizer).__name__ == "DeepSpeedZeRoOffload", type(engine.optimizer)
    losses = []
    with torch.no_grad():
        for _ in range(3):
            x = next(stream)
            losses.append(engine(input_ids=x, labels=x).loss.item())
    engine.destroy()
    engine.destroy()
    states = None
    if not stock:
        stats = tencache_ds.stats(engine)
        # an engine that no longer exists: its model's parameter swapper rests, its slots given back
        states = [stats.get("param_swapper_resting"), stats.get("param_swapper_closed"),
                  stats.get("param_reserved_bytes") == 0]
    del engine

    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=json.loads(json.dumps(cfg)))
    losses += [train.train_step(engine, stream, 1).item() for _ in range(2)]
    print("RESULT " + json.dumps({"losses": losses, "states": states}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
