"""An optimizer step interrupted (Ctrl-C, a preemption handler's SystemExit) while a sub-group's tensors go back to
the store at its swap-out: the interrupt lands right after the first of them went back. The rest went back too, so
the engine closes (helper-193: they stayed lent, recorded nowhere, and the store's close stopped on them: "cannot
forget tensor ... it is lent", the streaming arena never unmapped).

    python interrupted_give_back.py NVME_DIR [first]

``first``: the interrupt lands in the first step, whose Adam moments are new (not lent), and a second step follows:
they are stored all the same (helper-209: registered with no entry and no file, the next swap-in read a missing
file).

Prints one JSON line: {"interrupted": the step raised KeyboardInterrupt, "next_step_error": the next step's error or
null (``first``), "destroy_error": destroy's error or null}.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_nvme_engine import tiny_nvme_engine, train_step  # noqa: E402  (sets the one-rank environment first)
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3  # noqa: E402

engine = tiny_nvme_engine(sys.argv[1])
first = sys.argv[2:3] == ["first"]
if not first:
    train_step(engine)  # (the moments exist: the second step's swap-out gives back master, moments and gradient)
store = engine.optimizer.optimizer_swapper.store
release, step = store.release, DeepSpeedZeroOptimizer_Stage3._optimizer_step
armed = []


def interrupted_after_the_first_release(*args, **kwargs):
    result = release(*args, **kwargs)
    if armed:
        armed.clear()
        raise KeyboardInterrupt
    return result


def arming_at_the_second_sub_group(self, sub_group_id):
    result = step(self, sub_group_id)  # its swap-out follows, in the caller
    if sub_group_id == 1:
        armed.append(True)
    return result


store.release = interrupted_after_the_first_release
DeepSpeedZeroOptimizer_Stage3._optimizer_step = arming_at_the_second_sub_group
try:
    train_step(engine)
    interrupted = False
except KeyboardInterrupt:
    interrupted = True
DeepSpeedZeroOptimizer_Stage3._optimizer_step = step
store.release = release
next_step_error = None
if first:
    try:
        train_step(engine)
    except Exception as err:  # noqa: BLE001  (reported)
        next_step_error = f"{type(err).__name__}: {err}"
try:
    engine.destroy()
    error = None
except Exception as err:  # noqa: BLE001  (reported)
    error = f"{type(err).__name__}: {err}"
result = {"interrupted": interrupted, "destroy_error": error}
if first:
    result["next_step_error"] = next_step_error
print("RESULT " + json.dumps(result), flush=True)
os._exit(0)
