"""A save after an optimizer step that stopped part way (an update that raised after its sub-group's swap-in, as
Ctrl-C or an error in the C++ step does; the common `except KeyboardInterrupt: engine.save_checkpoint(...)`):
refused before any file is written, naming the sub-group (helper-177: the save wrote the model's files, then
stopped at the lent gradient's flush, a part-written checkpoint).

    python stopped_step_save.py NVME_DIR CHECKPOINT_DIR

Prints one JSON line: {"error": the save's error, "written": the checkpoint folder's files}.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_nvme_engine import tiny_nvme_engine, train_step  # noqa: E402  (sets the one-rank environment first)
import torch  # noqa: E402
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3  # noqa: E402

nvme, checkpoint = sys.argv[1], sys.argv[2]
engine = tiny_nvme_engine(nvme)
train_step(engine)
engine.backward(engine(torch.randn(2, 768)).pow(2).mean())
step = DeepSpeedZeroOptimizer_Stage3._optimizer_step


def stopped_at_the_second_sub_group(self, sub_group_id):
    if sub_group_id == 1:
        raise KeyboardInterrupt  # after that sub-group's swap-in, before its swap-out
    return step(self, sub_group_id)


DeepSpeedZeroOptimizer_Stage3._optimizer_step = stopped_at_the_second_sub_group
try:
    engine.step()
except KeyboardInterrupt:
    pass
DeepSpeedZeroOptimizer_Stage3._optimizer_step = step
try:
    engine.save_checkpoint(checkpoint, tag="after-interrupt")
    error = None
except Exception as err:  # noqa: BLE001  (reported)
    error = f"{type(err).__name__}: {err}"
written = sorted(os.listdir(os.path.join(checkpoint, "after-interrupt"))) \
    if os.path.isdir(os.path.join(checkpoint, "after-interrupt")) else []
print("RESULT " + json.dumps({"error": error, "written": written}), flush=True)
os._exit(0)
