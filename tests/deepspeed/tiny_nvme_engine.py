"""Three 768 x 768 linear layers, one optimizer sub-group each, the optimizer on NVMe under tencache with no host
tier (every state on file): the engine of the single-process checkpoint scripts (stopped_step_save.py,
interrupted_resave.py), one rank, one process."""
import json
import os

for _key, _value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                     ("MASTER_PORT", "0")):
    os.environ.setdefault(_key, _value)

import torch  # noqa: E402
import tencache_ds  # noqa: E402,F401
import deepspeed  # noqa: E402


def tiny_nvme_engine(nvme: str, groups=None):
    """``groups``: the layers' indexes in each parameter group (default: one group)."""
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 768 * 768,
                                    "offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
              "tencache": {"host_cache_bytes": 0}}
    torch.manual_seed(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(768, 768, bias=False) for _ in range(3)])
    parameters = model.parameters() if groups is None else \
        [{"params": [model[index].weight for index in group]} for group in groups]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=parameters, config=config)
    return engine


def train_step(engine) -> None:
    engine.backward(engine(torch.randn(2, 768)).pow(2).mean())
    engine.step()


def print_load_result(engine, checkpoint: str, tag: str) -> None:
    """engine.load_checkpoint(checkpoint, tag), then one line ``RESULT {"error": its error or null}``."""
    try:
        engine.load_checkpoint(checkpoint, tag=tag)
        error = None
    except Exception as err:  # noqa: BLE001  (reported)
        error = f"{type(err).__name__}: {err}"
    print("RESULT " + json.dumps({"error": error}), flush=True)
