"""Ad-hoc: DeepSpeed's aio handle (stock's settings, page-locked buffers, stock's pattern: N async tensor requests
then wait) against tencache's engine (measure_drive, 64 MiB requests, 2 in flight), alternating rounds."""
import os, sys, time, torch
from deepspeed.ops.op_builder import AsyncIOBuilder
from tencache_ds.io.drive_rate import measure_drive
folder = sys.argv[1]; tensor_bytes = int(sys.argv[2]); count = int(sys.argv[3]); rounds = int(sys.argv[4])
os.makedirs(folder, exist_ok=True)
aio = AsyncIOBuilder().load(verbose=False)
h = aio.aio_handle(1 << 20, 8, False, True, 1)
bufs = [h.new_cpu_locked_tensor(tensor_bytes // 4, torch.empty(0, dtype=torch.float32)) for _ in range(count)]
for i, b in enumerate(bufs): b.fill_(i + 1.5)
paths = [os.path.join(folder, f"t{i}.bin") for i in range(count)]
def aio_round():
    t = time.perf_counter()
    for b, p in zip(bufs, paths): assert h.async_pwrite(b, p, 0) == 0
    assert h.wait() == count
    w = time.perf_counter() - t
    t = time.perf_counter()
    for b, p in zip(bufs, paths): assert h.async_pread(b, p, 0) == 0
    assert h.wait() == count
    r = time.perf_counter() - t
    n = tensor_bytes * count
    return n / r / 1e9, n / w / 1e9
# first write allocates the files: untimed
aio_round()
for k in range(rounds):
    ar, aw = aio_round()
    d = measure_drive(folder + "/eng", request_sizes=(64 << 20,), thread_counts=(2,), trial_bytes=1 << 30, deadline_s=20)
    print(f"round {k}: aio read {ar:.2f} write {aw:.2f} GB/s | engine read {d.read_bytes_per_s/1e9:.2f} write {d.write_bytes_per_s/1e9:.2f} GB/s", flush=True)
