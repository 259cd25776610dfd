"""A swapper that only one rank cannot build (another run holding that rank's swap folder, a stale build lock on
its node, its node's memlock limit): every rank stops with an error that says so (helper-195: the other rank went
on into zero.Init's broadcast, or stage 3's next collective, and waited there: with NCCL until its timeout, with
gloo until rank 1 exited, then "Connection reset by peer"). Rank 1's
parameter swapper (``params``) or optimizer swapper (``optimizer``) is refused by a patched check; or (``save``)
rank 1 cannot remove its swap files of an earlier save into the same tag (root-squashed NFS, say: helper-202), at
the second of two saves into one tag.

    deepspeed --num_gpus 2 one_rank_refused.py params|optimizer|save|initialize NVME_DIR

``initialize``: rank 1 alone refuses the configuration at deepspeed.initialize (a path its node cannot write, a
stale build lock there: helper-213). ``initialize-first``: the same, in a script whose first distributed call is
deepspeed.initialize (no init_distributed, no zero.Init: the README's own pattern; helper-225).

Rank 0 prints one RESULT line: {"error": rank 0's error, or null}.
"""
import json
import os
import shutil
import sys

import torch
import tencache_ds  # noqa: F401  (installs the swappers)
import deepspeed
from tencache_ds.errors import TencacheConfigError
from tencache_ds.integrations.deepspeed import optimizer_swapper, param_swapper

ARGS = [arg for arg in sys.argv[1:] if not arg.startswith("--local_rank")]  # the launcher adds --local_rank=N
which, nvme = ARGS[0], ARGS[1]


def refused(*_args, **_kwargs):
    raise TencacheConfigError("refused on rank 1 (the test's patched check)")


if int(os.environ["RANK"]) == 1:
    if which == "params":
        param_swapper.resolve_budgets = refused
    elif which == "optimizer":
        optimizer_swapper.raise_if_stale_locks = refused
    elif which in ("initialize", "initialize-first"):
        from tencache_ds.integrations.deepspeed import install
        install.validate_ds_config = refused
if which != "initialize-first":
    deepspeed.init_distributed()
offload = {"device": "nvme", "nvme_path": nvme, "pin_memory": False}
config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6,
          "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_param": dict(offload),
                                "offload_optimizer": dict(offload)},
          "tencache": {"host_cache_bytes": 0}}
try:
    if which == "initialize-first":  # (zero.Init sets deepspeed.comm up, even a disabled one)
        model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(2)])
    else:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(2)])
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    if which == "save":
        checkpoints = os.path.join(nvme, "checkpoints")
        engine.save_checkpoint(checkpoints, tag="t")
        if int(os.environ["RANK"]) == 1:
            rmtree = shutil.rmtree

            def refused_removal(path, *args, **kwargs):
                if "offloaded_tensors" in str(path):
                    raise PermissionError(13, "Permission denied (the test's patched removal)", str(path))
                return rmtree(path, *args, **kwargs)

            shutil.rmtree = refused_removal
        engine.save_checkpoint(checkpoints, tag="t")
    error = None
except Exception as err:  # noqa: BLE001  (reported)
    error = f"{type(err).__name__}: {err}"
if int(os.environ["RANK"]) == 0:
    print("RESULT " + json.dumps({"error": error}), flush=True)
os._exit(0)
