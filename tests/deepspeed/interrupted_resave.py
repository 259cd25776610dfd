"""A second save into a tag saved before, stopped part way through placing its swap files (Ctrl-C, a full disk,
preemption), then a load of that tag by a fresh engine (helper-182: the tag mixed the new model and ZeRO files with
the earlier save's masters and moments, and loaded without a word).

    python interrupted_resave.py save|load NVME_DIR CHECKPOINT_DIR

Prints one JSON line: save: {"stopped": whether the second save stopped}; load: {"error": the load's error}.
"""
import json
import os
import sys

os.environ.setdefault("MASTER_PORT", "0")
for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
    os.environ.setdefault(key, value)

import torch  # noqa: E402
import tencache_ds  # noqa: E402,F401
import deepspeed  # noqa: E402
from tencache_ds.integrations.deepspeed import checkpoint_save  # noqa: E402

mode, nvme, checkpoint = sys.argv[1:4]
config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6,
          "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 768 * 768,
                                "offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
          "tencache": {"host_cache_bytes": 0}}
torch.manual_seed(1)
model = torch.nn.Sequential(*[torch.nn.Linear(768, 768, bias=False) for _ in range(3)])
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)


def step():
    engine.backward(engine(torch.randn(2, 768)).pow(2).mean())
    engine.step()


if mode == "save":
    step()
    engine.save_checkpoint(checkpoint, tag="t")
    step()
    place, calls = checkpoint_save.place, []

    def stopped_at_the_fourth_file(*args, **kwargs):
        calls.append(args)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return place(*args, **kwargs)

    checkpoint_save.place = stopped_at_the_fourth_file
    try:
        engine.save_checkpoint(checkpoint, tag="t")
        stopped = False
    except KeyboardInterrupt:
        stopped = True
    print("RESULT " + json.dumps({"stopped": stopped}), flush=True)
else:
    try:
        engine.load_checkpoint(checkpoint, tag="t")
        error = None
    except Exception as err:  # noqa: BLE001  (reported)
        error = f"{type(err).__name__}: {err}"
    print("RESULT " + json.dumps({"error": error}), flush=True)
os._exit(0)
