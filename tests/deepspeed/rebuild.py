"""An engine rebuilt in one process, the pattern of DeepSpeed's own NVMe checkpoint tests: train, save, train on,
engine.destroy(), a new zero.Init model, deepspeed.initialize, load_checkpoint, train. Prints one RESULT line.

    python tests/deepspeed/rebuild.py stock|tencache NVME_DIR CHECKPOINT_DIR PARAM_DEVICE OPTIMIZER_DEVICE
(devices: nvme, cpu or none)
"""
import gc
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import train  # noqa: E402
import deepspeed  # noqa: E402

OFFLOAD_ONLY_KEYS = ("nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pipeline_read", "pipeline_write")


def config(mode, nvme, param_device, optimizer_device):
    args = train.parse_args(["--deepspeed_config", os.path.join(REPO, "configs", "stock-nvme.json"),
                             "--nvme-path", nvme, "--tencache-block", "none" if mode == "stock" else "{}",
                             "--dtype", "fp32"])  # fp32: see test_residency.py
    cfg = train.load_ds_config(args.ds_config_path, args)
    zero = cfg["zero_optimization"]
    for section, device in (("offload_param", param_device), ("offload_optimizer", optimizer_device)):
        if device == "none":
            zero.pop(section)
        else:
            zero[section]["device"] = device
            if device == "cpu":
                for key in OFFLOAD_ONLY_KEYS:
                    zero[section].pop(key, None)
    return cfg


def main(mode, nvme, checkpoint, param_device, optimizer_device):
    train.ensure_dist_env()
    deepspeed.init_distributed()
    if mode != "stock":
        import tencache_ds
    cfg = config(mode, nvme, param_device, optimizer_device)
    _, model_cfg = train.load_model_config("gpt2-tiny")

    def build():
        train.seed_everything(1234)
        model, _ = train.build_model("zero", model_cfg, json.loads(json.dumps(cfg)))
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=json.loads(json.dumps(cfg)))
        return engine

    def batches(skip):
        stream = train.synthetic_batches(model_cfg.vocab_size, 2, 64, 1)
        for _ in range(skip):
            next(stream)
        return stream

    engine = build()
    stream = batches(0)
    losses = [train.train_step(engine, stream, 1).item() for _ in range(2)]
    engine.save_checkpoint(checkpoint, tag="t")
    # two steps: the second's loss is the first update's after the load, so the optimizer's state must have come
    # back too, not only the weights (helper-227: one step checked the weights alone)
    before = [train.train_step(engine, stream, 1).item() for _ in range(2)]
    engine.destroy()
    closed = None
    if mode != "stock":
        stats = tencache_ds.stats(engine)
        # the optimizer swapper closes with its engine; the parameter swapper rests (its model could still use it)
        closed = [stats.get("param_swapper_resting"), stats.get("optimizer_swapper_closed")]
    del engine
    gc.collect()
    engine = build()
    engine.load_checkpoint(checkpoint, tag="t")
    resumed = batches(2)
    after = [train.train_step(engine, resumed, 1).item() for _ in range(2)]
    print("RESULT " + json.dumps({"losses": losses, "before": before, "after": after, "closed": closed}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:6])
