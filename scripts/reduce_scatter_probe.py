"""Stage 3's gradient reduce at one rank on the CPU accelerator, timed apart, with and without a resident ballast:
DeepSpeed's ``reduce_scatter_coalesced`` (gloo, a world of one; for machines without a GPU) over one flat fp32
tensor of the model's size and over the model's own parameter shapes, and writes into fresh memory (what
calibrate.py's fresh-write probe times).

    python3 scripts/reduce_scatter_probe.py --model gpt2-medium [--ballast-gb 0 12]

Why (docs/estimate.md, "gpt2-medium's compute-bound rows"): in a gpt2-medium step stage 3's gradient epilogue took
4.7 s where the step model prices the backward's host-memory work at 1.7 s, and the same reduce ran 1.9-2.4x
slower in a process holding 12 GB than in an empty one (give the ballasts in both orders to rule out drift).
"""
import argparse
import json
import os
import statistics
import time

import torch


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        times.append(fn())
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2-medium", help="name in configs/models/")
    p.add_argument("--ballast-gb", type=float, nargs="+", default=[0, 12],
                   help="resident memory held (written) while timing, one round per value")
    p.add_argument("--repeats", type=int, default=4, help="per measurement; the first is dropped from the median")
    args = p.parse_args()
    if args.repeats < 2:
        p.error("--repeats must be at least 2 (the first of each is dropped from the median)")
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29573"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    import deepspeed
    from deepspeed.runtime.comm.coalesced_collectives import reduce_scatter_coalesced
    from transformers import AutoConfig, AutoModelForCausalLM
    deepspeed.init_distributed(verbose=False)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "configs", "models", f"{args.model}.json")) as f:
        config = json.load(f)
    with torch.device("meta"):
        shapes = [p.shape for p in AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).parameters()]
    numel = sum(s.numel() for s in shapes)

    def reduce(make):
        def once():
            grads = make()
            started = time.perf_counter()
            out = reduce_scatter_coalesced(grads, None)
            seconds = time.perf_counter() - started
            del out, grads
            return seconds
        return once

    def fresh_write():
        started = time.perf_counter()
        torch.empty(numel).fill_(1.0)
        return time.perf_counter() - started

    print(f"{args.model}: {numel / 1e6:.1f} M parameters, {numel * 4 / 2**30:.2f} GiB of fp32 gradients, "
          f"{torch.get_num_threads()} threads")
    for ballast_gb in args.ballast_gb:
        ballast = torch.ones(int(ballast_gb * 1e9) // 4) if ballast_gb else None
        rows = {"reduce, one flat tensor": timed(reduce(lambda: [torch.randn(numel)]), args.repeats),
                "reduce, the model's shapes": timed(reduce(lambda: [torch.randn(s) for s in shapes]), args.repeats),
                "fresh write of that size": timed(fresh_write, args.repeats)}
        for name, times in rows.items():
            print(f"ballast {ballast_gb:4.0f} GB  {name:28s} median {statistics.median(times[1:]):6.3f} s  "
                  f"fastest {min(times):6.3f} s  all {[round(t, 3) for t in times]}", flush=True)
        del ballast


if __name__ == "__main__":
    main()
