"""A gradient set through DeepSpeed's API (safe_set_full_grad: stage 3 writes the sub-group's gradient back), then
scaled in place by the update's clipping, and a parameter of that sub-group without a gradient in the next step (a
branch not taken): that step's update reads the parameter's old gradient, which stock CPU offload's buffer holds
scaled. Streamed (host cache 0), tencache's file kept it unscaled until 2026-12-07 (helper-147's and helper-163's
reviews): the branch's weights differed from the step after. Prints one RESULT line: per step the loss bits, and the
sha256 of the fp32 weights at the end.

    python tests/deepspeed/written_back_gradient.py stock-cpu|tencache NVME_DIR
"""
import hashlib
import json
import os
import struct
import sys

import torch

MODE, NVME = sys.argv[1], sys.argv[2]
if MODE == "tencache":
    import tencache_ds  # noqa: F401  (installs the swappers)
import deepspeed  # noqa: E402
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad, safe_set_full_grad  # noqa: E402

from branch_net import HIDDEN, Net  # noqa: E402  (tests/deepspeed/branch_net.py)
BRANCH = [True, False, True, True]  # the branch's gradient is stale (the last set one, scaled) at step 1


def main():
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29518"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                        ("LOCAL_RANK", "0")):
        os.environ.setdefault(name, value)
    torch.manual_seed(1234)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1000000,
              "gradient_clipping": 1e-3,  # every update scales the gradient
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "offload_optimizer": {"device": "nvme", "nvme_path": NVME, "pin_memory": False,
                                                          "buffer_count": 4}},
              "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1}}
    if MODE == "stock-cpu":
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    else:
        config["tencache"] = {"host_cache_bytes": 0}  # the gradient streams
    model = Net()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    generator = torch.Generator().manual_seed(7)
    losses = []
    for step, take_branch in enumerate(BRANCH):
        loss = engine(torch.randn(2, HIDDEN, generator=generator), take_branch)
        engine.backward(loss)
        if step == 0:  # the user edits gradients: here reads and sets them back unchanged
            for param in engine.module.parameters():
                safe_set_full_grad(param, safe_get_full_grad(param))
        engine.step()
        losses.append(struct.unpack("<I", struct.pack("<f", loss.item()))[0])
    digest = hashlib.sha256()
    for param in engine.module.parameters():
        digest.update(safe_get_full_fp32_param(param).numpy().tobytes())
    print("RESULT " + json.dumps({"losses": losses, "weights": digest.hexdigest()}), flush=True)


if __name__ == "__main__":
    main()
