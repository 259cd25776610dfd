"""The body of a helper script that runs several scenarios in one launch of two ranks (upstream_checkpoints.py,
tensor_fragments.py): the launch's start-up, not the scenarios, is most of their time. Each scenario's result, or
its error, goes into the one RESULT line rank 0 prints (tests/deepspeed/conftest.py ``launch_two_ranks`` reads it).
Also what the scenarios measure: a digest of tensors, the gathered weights.
"""
import hashlib
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "scripts"))
import shm_buffers  # noqa: E402  (scripts/shm_buffers.py)


def run_scenarios(runs):
    """``runs``: (name, function of no arguments returning a dict), in order. A failure is its scenario's result
    and the last one run: a rank that failed may have left the other inside a collective, and a next scenario
    would not line up with it."""
    import deepspeed
    deepspeed.init_distributed()
    if shm_buffers.creates_buffers():  # as scripts/train.py does: no shared-memory buffer left behind
        deepspeed.comm.barrier()
        shm_buffers.remove_own_buffer()
    results = {}
    for name, scenario in runs:
        started = time.monotonic()
        try:
            results[name] = {"ok": True, **scenario()}
        except Exception as err:
            traceback.print_exc()
            results[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            break
        finally:  # where a launch's time goes (its output is the test's on failure)
            print(f"scenario {name}: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
        torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)


def digest(values):
    """SHA-256 over {name: tensor or None} in name order (fp32 bytes); None counts as its own value."""
    h = hashlib.sha256()
    for name in sorted(values):
        h.update(name.encode())
        value = values[name]
        h.update(b"None" if value is None else value.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def gathered(engine):
    """{name: the parameter's whole weight in fp32}, each gathered (a collective: every rank calls it)."""
    import deepspeed
    weights = {}
    for name, param in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters(param, modifier_rank=None):
            weights[name] = param.detach().float().cpu().clone()
    return weights
