"""A checkpoint whose optimizer swapped a sub-group that the resuming engine keeps in memory (a larger
``aio.block_size``: stage 3 swaps only sub-groups of at least a block): the load must refuse, naming the knob, before
anything is placed (helper-172: the sub-group's saved moments were dropped, Adam started over for it).

    python swap_threshold_resume.py NVME_DIR CHECKPOINT_DIR BLOCK save|load

``save`` trains two steps and saves; ``load``, in a fresh process (the sub-groups get the ids they had at the save),
loads. Prints one JSON line: {"error": the load's error, or None}.
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

nvme, checkpoint, block, action = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
MIB = 2**20


class Model(torch.nn.Module):
    """A 1536 x 768 weight (4.5 MiB in fp32) and, in a group of its own, a 2 MiB vector: two sub-groups."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(768, 1536) / 768)
        self.scale = torch.nn.Parameter(torch.ones(2 * MIB // 4))

    def forward(self, x):
        return (x @ self.weight).pow(2).mean() + self.scale.mean()


def engine_with(block):
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "aio": {"block_size": block, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                      "overlap_events": True},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
              "tencache": {"host_cache_bytes": 0}}
    torch.manual_seed(1)
    model = Model()
    groups = [{"params": [model.weight]}, {"params": [model.scale], "weight_decay": 0.0}]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=config)
    return engine


engine, error = engine_with(block), None
if action == "save":
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 768)))
        engine.step()
    engine.save_checkpoint(checkpoint, tag="saved")
else:
    try:
        engine.load_checkpoint(checkpoint, tag="saved")
    except Exception as err:  # noqa: BLE001  (reported)
        error = f"{type(err).__name__}: {err}"
print("RESULT " + json.dumps({"error": error}), flush=True)
os._exit(0)
