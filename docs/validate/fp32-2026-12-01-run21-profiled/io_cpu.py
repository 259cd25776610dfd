"""The forty-fourth session (docs/estimate.md, after run 21): the process's CPU seconds per GB moved by DeepSpeed's
aio handle (stock's aio settings: 1 MiB blocks, queue depth 8, one thread) and by tencache's engine (4 threads), 8
requests of REQ_MIB in flight at a time, 10 times, reads then writes, 2 rounds. LOCKED=1 gives the handle buffers
it locked itself (new_cpu_locked_tensor), as stock's swap pools are; without it, plain aligned buffers, which the
handle copies through a fresh page-locked bounce buffer per request. The file and the written ones are removed at
the end. LOCKED=1 python3 io_cpu.py [FOLDER_ON_THE_DRIVE] [REQ_MIB]"""
import os, resource, sys, time
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, REPO)
import torch
from deepspeed.ops.op_builder import AsyncIOBuilder
from tencache_ds.io.direct_io import DirectFileIO
from tencache_ds.io.drive_rate import aligned_buffer
folder = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
REQ = (int(sys.argv[2]) if len(sys.argv) > 2 else 64) << 20
K, N = 8, 10
path = os.path.join(folder, "io-cpu-probe.bin")
with open(path, "wb") as f:
    for _ in range(K * N):
        f.write(os.urandom(1 << 20) * (REQ >> 20))
os.sync()
handle = AsyncIOBuilder().load().aio_handle(1048576, 8, False, True, 1)
engine = DirectFileIO(num_threads=4, name="io-cpu")
plain = [aligned_buffer(torch, REQ) for _ in range(K)]
locked = [handle.new_cpu_locked_tensor(REQ, torch.zeros(1, dtype=torch.uint8)) for _ in range(K)] \
    if os.environ.get("LOCKED") == "1" else plain


def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def run(mode, round_index):
    (user0, sys0), started = cpu(), time.perf_counter()
    for i in range(N):
        offsets = [((i * K + k) % (K * N)) * REQ for k in range(K)]
        if mode == "ds-read":
            [handle.async_pread(b, path, o) for b, o in zip(locked, offsets)]; handle.wait()
        elif mode == "ds-write":
            [handle.async_pwrite(b, f"{path}.w{k}", 0) for k, b in enumerate(locked)]; handle.wait()
        elif mode == "tc-read":
            [f.result() for f in [engine.read(b, path, REQ, o) for b, o in zip(plain, offsets)]]
        else:
            [f.result() for f in [engine.write(b, f"{path}.w{k}", REQ, 0) for k, b in enumerate(plain)]]
    wall, (user1, sys1) = time.perf_counter() - started, cpu()
    gb = K * N * REQ / 1e9
    print(f"{mode:9s} round {round_index} {gb / wall:5.2f} GB/s  cpu {(user1 - user0 + sys1 - sys0) / gb:.3f} s/GB "
          f"(user {(user1 - user0) / gb:.3f}, sys {(sys1 - sys0) / gb:.3f})", flush=True)


try:
    for round_index in range(2):
        for mode in ("ds-read", "tc-read", "ds-write", "tc-write"):
            run(mode, round_index)
finally:
    engine.close()
    for name in [path] + [f"{path}.w{k}" for k in range(K)]:
        if os.path.exists(name):
            os.remove(name)
