"""The same model under a new engine after ``engine.destroy()``: Hugging Face Accelerate's ``free_memory()`` destroys
the engine before the same model is prepared again (a second ``trainer.train()``, ``auto_find_batch_size``, trainers
that swap optimizers). Train two steps, destroy (twice: stock tolerates it), ``deepspeed.initialize`` the same
zero.Init model, train two more. Prints one RESULT line: the losses, and tencache's swapper states.

    python tests/deepspeed/reinitialize.py stock|tencache NVME_DIR
"""
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402
import deepspeed  # noqa: E402
from rebuild import config  # noqa: E402


def main(mode, nvme):
    train.ensure_dist_env()
    deepspeed.init_distributed()
    if mode != "stock":
        import tencache_ds
    cfg = config(mode, nvme, "nvme", "nvme")
    _, model_cfg = train.load_model_config("gpt2-tiny")
    train.seed_everything(1234)
    model, _ = train.build_model("zero", model_cfg, json.loads(json.dumps(cfg)))
    stream = train.synthetic_batches(model_cfg.vocab_size, 2, 64, 1)
    states = []
    losses = []
    for _ in range(2):
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=json.loads(json.dumps(cfg)))
        losses += [train.train_step(engine, stream, 1).item() for _ in range(2)]
        engine.destroy()
        engine.destroy()
        if mode != "stock":
            stats = tencache_ds.stats(engine)
            states.append([stats.get("param_swapper_resting"), stats.get("param_swapper_closed"),
                           stats.get("optimizer_swapper_closed"),
                           stats.get("param_reserved_bytes") == 0])  # its slots given back
    print("RESULT " + json.dumps({"losses": losses, "states": states}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
