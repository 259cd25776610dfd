"""A parameter with a gradient in an earlier micro-batch of an accumulation window but none in its last one (a
mixture-of-experts routing, here a branch taken by schedule). Stage 3 reduces its gradient into its host buffer in
the earlier micro-batch and hands the optimizer swapper none at the boundary: stock's update reads the bytes its
file got at the last window that handed them, tencache's the buffer (integrations/deepspeed/stage3_gradients.py).
tencache counts and warns of such reads. Prints one RESULT line: per step the loss bits, and tencache's count.

With ``late`` the branch is taken only in each window's last micro-batch after the first window, and gradients are
clipped hard (every update scales them): stage 3 then accumulates the branch's new gradient onto what its buffer
kept from the window before (it copies over the buffer only in a window's first micro-batch), so that buffer must
hold what was reduced, never what an update scaled (stock keeps the update's gradient apart from it). ``stock-cpu``
is stock with the optimizer offloaded to the CPU (stock NVMe gives its bits here).

    python tests/deepspeed/skipped_branch.py stock|stock-cpu|tencache NVME_DIR [late]
"""
import json
import os
import struct
import sys

import torch

MODE, NVME = sys.argv[1], sys.argv[2]
LATE = sys.argv[3:] == ["late"]
if MODE == "tencache":
    import tencache_ds  # noqa: F401  (installs the swappers; DeepSpeed is imported already where forked)
import deepspeed  # noqa: E402

from branch_net import HIDDEN, Net  # noqa: E402  (tests/deepspeed/branch_net.py)
# micro-batches of each optimizer step (gradient accumulation 2) that take the branch: step 0 hands its gradient
# at the boundary; step 1 reduces it in micro-batch 0 only, and hands nothing; step 2 does not take it at all (stage
# 3's buffer still holds step 1's sum); step 3 hands it again
BRANCH = [(True, True), (True, False), (False, False), (True, True)]
# ``late``: handed in every window, reduced in the first micro-batch of the first window only
BRANCH_LATE = [(True, True), (False, True), (False, True), (False, True)]


def main():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    torch.manual_seed(1234)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1000000,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "offload_optimizer": {"device": "nvme", "nvme_path": NVME, "pin_memory": False,
                                                          "buffer_count": 4}},
              "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1}}
    if LATE:
        config["gradient_clipping"] = 1e-3
    if MODE == "stock-cpu":
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if MODE == "tencache":
        config["tencache"] = {}
    model = Net()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    generator = torch.Generator().manual_seed(7)
    losses, counts = [], []
    for step_branches in BRANCH_LATE if LATE else BRANCH:
        for take_branch in step_branches:
            loss = engine(torch.randn(2, HIDDEN, generator=generator), take_branch)
            engine.backward(loss)
            engine.step()
        losses.append(struct.unpack("<I", struct.pack("<f", loss.item()))[0])
        stats = tencache_ds.stats(engine) if MODE == "tencache" else {}
        counts.append(stats.get("optimizer_gradient_fragments_reduced_not_handed"))
    print("RESULT " + json.dumps({"losses": losses, "reduced_not_handed": counts}), flush=True)


if __name__ == "__main__":
    main()
