import os, sys, time, torch
from deepspeed.ops.op_builder import AsyncIOBuilder
from tencache_ds.io.direct_io import DirectFileIO, aligned_buffer
folder = sys.argv[1]; req = int(sys.argv[2]); n = int(sys.argv[3]); rounds = int(sys.argv[4])
os.makedirs(folder, exist_ok=True)
aio = AsyncIOBuilder().load(verbose=False)
h = aio.aio_handle(1 << 20, 8, False, True, 1)
big = h.new_cpu_locked_tensor(req * n // 4, torch.empty(0, dtype=torch.float32)); big.fill_(1.5)
bufs = [big.narrow(0, i * req // 4, req // 4) for i in range(n)]
paths = [os.path.join(folder, f"p{i}.bin") for i in range(n)]
def aio_all(op):
    t = time.perf_counter()
    for b, p in zip(bufs, paths): assert getattr(h, op)(b, p, 0) == 0
    assert h.wait() == n
    return req * n / (time.perf_counter() - t) / 1e9
io = DirectFileIO(num_threads=2, name="x")
eb = [aligned_buffer(req) for _ in range(4)]
for b in eb: b.fill_(3)
def eng(kind):
    t = time.perf_counter(); fs = []
    for i, p in enumerate(paths):
        b = eb[i % 4]
        fs.append(io.write(b, p + ".e", req, 0) if kind == "w" else io.read(b, p + ".e", req, 0))
        if len(fs) >= 4: fs.pop(0).result()
    for f in fs: f.result()
    return req * n / (time.perf_counter() - t) / 1e9
aio_all("async_pwrite"); eng("w")
for k in range(rounds):
    print(f"aio write {aio_all('async_pwrite'):.2f} read {aio_all('async_pread'):.2f} | engine write {eng('w'):.2f} read {eng('r'):.2f}", flush=True)
