"""A second save into a tag saved before, stopped part way through placing its swap files (Ctrl-C, a full disk,
preemption), then a load of that tag by a fresh engine (helper-182: the tag mixed the new model and ZeRO files with
the earlier save's masters and moments, and loaded without a word).

    python interrupted_resave.py save|load|no_save_dir NVME_DIR CHECKPOINT_DIR

Prints one JSON line: save: {"stopped": whether the second save stopped}; load: {"error": the load's error};
no_save_dir (save_checkpoint("") and (None) from CHECKPOINT_DIR as the working folder, which holds a file where a
save into "" would put this rank's swap files: helper-192): {"errors": each save's error, "kept": the file is there}.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_nvme_engine import print_load_result, tiny_nvme_engine, train_step  # noqa: E402  (sets the one-rank environment first)
from tencache_ds.integrations.deepspeed import checkpoint_save  # noqa: E402

mode, nvme, checkpoint = sys.argv[1:4]
engine = tiny_nvme_engine(nvme)

if mode == "save":
    train_step(engine)
    engine.save_checkpoint(checkpoint, tag="t")
    train_step(engine)
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
elif mode == "no_save_dir":
    train_step(engine)
    kept = os.path.join(checkpoint, "global_step1", "offloaded_tensors", "rank00", "kept")
    os.makedirs(os.path.dirname(kept))
    open(kept, "w").close()
    os.chdir(checkpoint)
    errors = []
    for save_dir in ("", None):
        try:
            engine.save_checkpoint(save_dir)
            errors.append(None)
        except Exception as err:  # noqa: BLE001  (reported)
            errors.append(f"{type(err).__name__}: {err}")
    print("RESULT " + json.dumps({"errors": errors, "kept": os.path.exists(kept)}), flush=True)
else:
    print_load_result(engine, checkpoint, "t")
os._exit(0)
