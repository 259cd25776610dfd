"""DeepSpeed's aio handle (DeepSpeed's default aio settings: 1 MiB blocks, 8 in flight, one thread) on pageable and
on page-locked tensors, against tencache's engine (io/drive_rate.py, 64 MiB requests, 2 in flight), in turn, three
rounds: 4 tensors issued then waited for, 1 GiB a trial, writes then reads of what was written.

    python docs/validate/fp32-2026-11-30-run11/aio-buffers/aio_buffers.py /tmp/aio-buffers
"""
import os
import sys
import time

import torch
from deepspeed.ops.op_builder import AsyncIOBuilder

from tencache_ds.io.drive_rate import measure_drive

TENSOR_BYTES, IN_FLIGHT, TRIAL_BYTES = 64 << 20, 4, 1 << 30


def aio_rates(handle, folder, locked):
    example = torch.empty(0, dtype=torch.uint8)
    buffers = [handle.new_cpu_locked_tensor(TENSOR_BYTES, example) if locked else
               torch.empty(TENSOR_BYTES, dtype=torch.uint8) for _ in range(IN_FLIGHT)]
    batches = TRIAL_BYTES // (TENSOR_BYTES * IN_FLIGHT)
    paths = [[os.path.join(folder, f"aio-{batch}-{i}.bin") for i in range(IN_FLIGHT)] for batch in range(batches)]

    def timed(issue):
        started = time.perf_counter()
        for batch in paths:
            for buffer, path in zip(buffers, batch):
                assert issue(buffer, path) == 0
            assert handle.wait() == IN_FLIGHT
        return TRIAL_BYTES / (time.perf_counter() - started) / 1e9

    try:
        return timed(handle.async_pwrite), timed(handle.async_pread)
    finally:
        for path in (p for batch in paths for p in batch):
            os.remove(path)
        if locked:
            for buffer in buffers:
                handle.free_cpu_locked_tensor(buffer)


def main(folder):
    os.makedirs(folder, exist_ok=True)
    handle = AsyncIOBuilder().load(verbose=False).aio_handle(1 << 20, 8, False, True, 1)
    for round_ in range(3):
        engine = measure_drive(folder, request_sizes=(64 << 20,), thread_counts=(2,), trial_bytes=TRIAL_BYTES,
                               deadline_s=2.0, repeats=1).at_request_size(64 << 20)
        print(f"round {round_}: engine read {engine.read_bytes_per_s / 1e9:.2f} write "
              f"{engine.write_bytes_per_s / 1e9:.2f} GB/s", flush=True)
        for locked in (False, True):
            write, read = aio_rates(handle, folder, locked)
            print(f"round {round_}: aio {'page-locked' if locked else 'pageable'} read {read:.2f} write {write:.2f} "
                  f"GB/s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
