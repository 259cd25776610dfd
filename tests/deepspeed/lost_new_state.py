"""The first step's new optimizer state (Adam's moments) whose store fails (a victim's write refused, a mapping
refused, Ctrl-C in the copy): each of the others is still stored, and the lost one is never read from a file it
never wrote, here an earlier run's left in a reused folder (helper-220: the next swap-in read it without a word).

    python lost_new_state.py NVME_DIR CHECKPOINT_DIR [save-good|load-good|load-empty]

Prints one JSON line: {"first": the failed step's error, "stored": the sub-group's states the store has after it,
"next": the next step's error, "save": the save's error}. ``save-good``: a step trained without a failure, saved
as tag "good" (nothing else); ``load-good``: after the failure, that checkpoint is loaded as the error says to, and
a step trained ("load", "after_load": their errors; helper-228: the load's own rebuild met the refusal);
``load-empty``: the same with a checkpoint saved before any step, in this process (no state: Adam starts over
there; helper-232: the rebuild read the file never written).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_nvme_engine import tiny_nvme_engine, train_step  # noqa: E402  (sets the one-rank environment first)
from tencache_ds.integrations.deepspeed.optimizer_swapper import TencacheOptimizerSwapper  # noqa: E402

nvme, checkpoint = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else ""
engine = tiny_nvme_engine(nvme)
if mode == "save-good":
    train_step(engine)
    engine.save_checkpoint(checkpoint, tag="good")
    print("RESULT " + json.dumps({"saved": True}), flush=True)
    os._exit(0)
swapper = engine.optimizer.optimizer_swapper
store_new = TencacheOptimizerSwapper._store_new
failed = []


def first_moment_refused(self, path, source, widen=False):
    if os.path.basename(path).startswith("exp_avg-") and not failed:
        failed.append(path)
        raise OSError(28, "No space left on device (the test's refusal)")
    return store_new(self, path, source, widen)


def error_of(call):
    try:
        call()
        return None
    except Exception as err:  # noqa: BLE001  (reported)
        return f"{type(err).__name__}: {err}"


if mode == "load-empty":
    engine.save_checkpoint(checkpoint, tag="empty")
TencacheOptimizerSwapper._store_new = first_moment_refused
result = {"first": error_of(lambda: train_step(engine))}
TencacheOptimizerSwapper._store_new = store_new
lost = failed[0]
group = os.path.basename(lost)[len("exp_avg-"):]
# the states the store holds an entry of (on file, or held and written behind: the file may come later)
result["stored"] = sorted(name for name in ("exp_avg-" + group, "exp_avg_sq-" + group)
                          if swapper.store.knows(os.path.join(os.path.dirname(lost), name)))
# an earlier run's file of that name, of the size a read expects (not copied from the master's file, which writes
# behind may be replacing at this moment: a suite run met it missing)
numel = next(info.numel() for info in swapper.swap_params_info.values()
             if any(context.swap_path == lost for context in info.tensors))
with open(lost, "wb") as handle:
    handle.write(os.urandom(numel * 4))
result["next"] = error_of(lambda: train_step(engine))
result["save"] = error_of(lambda: engine.save_checkpoint(checkpoint, tag="t"))
if mode in ("load-good", "load-empty"):
    result["load"] = error_of(lambda: engine.load_checkpoint(checkpoint, tag=mode[len("load-"):]))
    result["after_load"] = error_of(lambda: train_step(engine))
print("RESULT " + json.dumps(result), flush=True)
os._exit(0)
