"""The host-side copies of an optimizer step with the optimizer on NVMe, timed apart: casting fp32 master weights
into bf16 partitions, stock's way (one flat cast per sub-group) and tencache's (one cast per parameter, into its arena
slot, page-locked and registered with CUDA or not); and, on a GPU, bringing fp32 gradients from the device into
pageable held buffers, directly (a synchronous staged copy per tensor) or through tencache's registered staging chunks
(memory/device_staging.py). A probe for the H200's 1.60x (docs/gpu_check.md, "Where the 1.60x goes"): gpt2-small's
parameter shapes, medians of 5.

    python3 scripts/host_copy_probe.py [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch

from tencache_ds.memory.arena import PinnedArena
from tencache_ds.memory.device_staging import StagedDeviceCopy


def gpt2_small_numels():
    d, vocab, positions, layers = 768, 50257, 1024, 12
    numels = [vocab * d, positions * d]
    for _ in range(layers):
        numels += [d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d]
    return numels + [d, d]


def median_s(fn, repeats=5):
    fn()  # first touch
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    numels = gpt2_small_numels()
    total = sum(numels)
    master = torch.randn(total)
    flat_bf16 = torch.empty(total, dtype=torch.bfloat16)
    results = {"threads": torch.get_num_threads(), "elements": total, "cuda": torch.cuda.is_available()}
    results["flat_cast_s"] = median_s(lambda: flat_bf16.copy_(master))

    def per_parameter(destinations):
        offset = 0
        for numel, destination in zip(numels, destinations):
            destination.copy_(master.narrow(0, offset, numel))
            offset += numel

    pageable = [torch.empty(n, dtype=torch.bfloat16) for n in numels]
    results["per_parameter_pageable_s"] = median_s(lambda: per_parameter(pageable))
    for name, lock, register in (("per_parameter_arena_unlocked_s", "off", False),
                                 ("per_parameter_arena_locked_s", "best_effort", False),
                                 ("per_parameter_arena_registered_s", "best_effort", True)):
        classes = {}
        for numel in numels:
            size = -(-numel * 2 // 4096) * 4096
            classes[size] = classes.get(size, 0) + 1
        arena = PinnedArena(classes, lock=lock, register_with_cuda=register, name=name)
        slots = [arena.alloc(n * 2) for n in numels]
        views = [slot.as_tensor(torch.bfloat16, n) for slot, n in zip(slots, numels)]
        results[name] = median_s(lambda: per_parameter(views))
        if register:
            results["arena_registered_bytes"] = arena.stats()["registered_bytes"]
        del views
        for slot in slots:
            arena.free(slot)
        arena.close()
    if torch.cuda.is_available():
        gradients = [torch.randn(n, device="cuda") for n in numels]
        held = [torch.empty(n) for n in numels]
        torch.cuda.synchronize()

        def direct():
            for destination, gradient in zip(held, gradients):
                destination.copy_(gradient)

        staging = StagedDeviceCopy()
        results["gradients_d2h_direct_s"] = median_s(direct)
        results["gradients_d2h_staged_s"] = median_s(lambda: staging.copy(list(zip(held, gradients))))
        for destination in held:  # what the direct copies left there must not pass for the staged copy's bytes
            destination.fill_(float("nan"))
        staging.copy(list(zip(held, gradients)))
        results["gradients_d2h_staged_identical"] = all(torch.equal(h, g.cpu()) for h, g in zip(held, gradients))
        staging.close()
    for key, value in results.items():
        print(f"{key:45s} {value:.4f}" if isinstance(value, float) else f"{key:45s} {value}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
