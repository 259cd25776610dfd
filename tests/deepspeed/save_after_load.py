"""A checkpoint saved by an engine that loaded one and took no step since (a preemption handler's save, a re-tag
script), each stage in a process of its own, as a user's runs are (helper-192: the fresh engine's moments, set from
the load as full-size uninitialised tensors, were saved as real ones into the ZeRO file).

    python save_after_load.py train|resave|resume NVME_DIR CHECKPOINT_DIR

train: two steps, saved as tag "first", then a third step (its loss printed); resave: load "first", save "second";
resume: load TAG (the fourth argument), two steps. Prints one JSON line: train: {"loss": the third step's loss bits};
resave: {"described": whether every swapped moment in "second"'s ZeRO file is a meta tensor, "moments": how many};
resume: {"losses": the two steps' loss bits}.
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_nvme_engine import tiny_nvme_engine  # noqa: E402  (sets the one-rank environment first)
import torch  # noqa: E402


def step_loss(engine) -> str:
    torch.manual_seed(7)
    loss = engine(torch.randn(2, 768)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    return loss.detach().double().numpy().tobytes().hex()


mode, nvme, checkpoint = sys.argv[1:4]
engine = tiny_nvme_engine(nvme)
if mode == "train":
    step_loss(engine)
    step_loss(engine)
    engine.save_checkpoint(checkpoint, tag="first")
    result = {"loss": step_loss(engine)}
elif mode == "resave":
    engine.load_checkpoint(checkpoint, tag="first")
    engine.save_checkpoint(checkpoint, tag="second")
    zero_file, = glob.glob(os.path.join(checkpoint, "second", "*optim_states.pt"))
    state = torch.load(zero_file, map_location="cpu", weights_only=False)["optimizer_state_dict"]
    moments = [value for per_param in state["optimizer_state_dict"]["state"].values()
               for value in per_param.values() if torch.is_tensor(value) and value.dim() > 0]
    result = {"described": all(value.device.type == "meta" for value in moments), "moments": len(moments)}
else:
    engine.load_checkpoint(checkpoint, tag=sys.argv[4])
    result = {"losses": [step_loss(engine), step_loss(engine)]}
print("RESULT " + json.dumps(result), flush=True)
os._exit(0)
