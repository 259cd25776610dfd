"""A save after an optimizer step that stopped part way (an update that raised after its sub-group's swap-in, as
Ctrl-C or an error in the C++ step does; the common `except KeyboardInterrupt: engine.save_checkpoint(...)`):
refused before any file is written, naming the sub-group (helper-177: the save wrote the model's files, then
stopped at the lent gradient's flush, a part-written checkpoint).

    python stopped_step_save.py NVME_DIR CHECKPOINT_DIR [between]

``between``: the step stopped between two sub-groups instead, none swapped in, the first updated (helper-220: the
save went on); then a whole step is trained and saved ("then_saved": its error, or null).

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
between = sys.argv[3:] == ["between"]
engine = tiny_nvme_engine(nvme)
train_step(engine)
engine.backward(engine(torch.randn(2, 768)).pow(2).mean())
# after the second sub-group's swap-in, before its swap-out; or before its swap-in, the first's update done
name = "_prepare_sub_group" if between else "_optimizer_step"
step = getattr(DeepSpeedZeroOptimizer_Stage3, name)


def stopped_at_the_second_sub_group(self, sub_group_id, *args):
    if sub_group_id == 1:
        raise KeyboardInterrupt
    return step(self, sub_group_id, *args)


setattr(DeepSpeedZeroOptimizer_Stage3, name, stopped_at_the_second_sub_group)
try:
    engine.step()
except KeyboardInterrupt:
    pass
setattr(DeepSpeedZeroOptimizer_Stage3, name, step)


def save(tag):
    try:
        engine.save_checkpoint(checkpoint, tag=tag)
        return None
    except Exception as err:  # noqa: BLE001  (reported)
        return f"{type(err).__name__}: {err}"


result = {"error": save("after-interrupt")}
result["written"] = sorted(os.listdir(os.path.join(checkpoint, "after-interrupt"))) \
    if os.path.isdir(os.path.join(checkpoint, "after-interrupt")) else []
if between:
    train_step(engine)
    result["then_saved"] = save("after-a-whole-step")
print("RESULT " + json.dumps(result), flush=True)
os._exit(0)
