"""A checkpoint saved with the three layers grouped [[0, 1], [2]] loaded by an engine that groups them [[0], [1, 2]]:
each layer's weight a sub-group of the same size in both, so the swap files fit by size and order (helper-190: the
load went on, each group's settings copied by its index; stock CPU offload's torch load refuses the groups).

    python regrouped_load.py save|load NVME_DIR CHECKPOINT_DIR

Prints one JSON line: {"error": the load's error} (save: {"saved": true}).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_nvme_engine import print_load_result, tiny_nvme_engine, train_step  # noqa: E402  (sets the one-rank environment first)

mode, nvme, checkpoint = sys.argv[1:4]
if mode == "save":
    engine = tiny_nvme_engine(nvme, groups=[[0, 1], [2]])
    train_step(engine)
    engine.save_checkpoint(checkpoint, tag="t")
    print("RESULT " + json.dumps({"saved": True}), flush=True)
else:
    engine = tiny_nvme_engine(nvme, groups=[[0], [1, 2]])
    print_load_result(engine, checkpoint, "t")
os._exit(0)
