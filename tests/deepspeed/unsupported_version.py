"""An unsupported DeepSpeed release, as far as tencache can tell: DeepSpeed's own version string set to 0.20.0
before tencache installs. Tries a tencache config at zero.Init and at deepspeed.initialize (each must be refused,
naming the versions, before a swap file exists), then trains one step of a stock config. Prints what happened.

    python unsupported_version.py NVME_FOLDER MASTER_PORT
"""
import os
import sys

import torch
import deepspeed

deepspeed.__version__ = "0.20.0"  # what an unsupported release reports; the rest of DeepSpeed is 0.19.8's
import tencache_ds  # noqa: E402  (installs now: DeepSpeed is imported)
from deepspeed.runtime.zero import stage3  # noqa: E402
from tencache_ds.integrations.deepspeed import install  # noqa: E402

os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
deepspeed.init_distributed(dist_backend="gloo")
nvme = sys.argv[1]
config = {"train_batch_size": 1, "zero_optimization": {"stage": 3,
          "offload_param": {"device": "nvme", "nvme_path": nvme},
          "offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
          "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "tencache": {}}
# only the entry points that check the config are in; the private hooks are DeepSpeed's own
print("INSTALLED", sorted(name for _owner, name, _ours in install._REBINDINGS))
print("POST_STEP_IS_STOCK", "_post_step" not in [name for _owner, name, _ours in install._REBINDINGS]
      and not hasattr(stage3.DeepSpeedZeroOptimizer_Stage3._post_step, "__wrapped__"))
for what in ("zero.Init", "initialize"):
    try:
        if what == "zero.Init":
            with deepspeed.zero.Init(config_dict_or_path=config):
                torch.nn.Linear(1024, 1024)
        else:
            deepspeed.initialize(model=torch.nn.Linear(4, 4), config=config)
        print(what, "NOT REFUSED")
    except tencache_ds.TencacheConfigError as err:
        print(what, "REFUSED", err)
print("SWAP FILES", os.path.exists(nvme) and os.listdir(nvme))
stock = {"train_batch_size": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=stock)
loss = engine(torch.ones(1, 4)).sum()
engine.backward(loss)
engine.step()
print("STOCK RAN")
