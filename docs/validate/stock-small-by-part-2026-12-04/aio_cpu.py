import os, sys, time, torch, threading
from deepspeed.ops.op_builder import AsyncIOBuilder
from tencache_ds.io.direct_io import DirectFileIO, aligned_buffer
folder = sys.argv[1]; os.makedirs(folder, exist_ok=True)
aio = AsyncIOBuilder().load(verbose=False)
h = aio.aio_handle(1 << 20, 8, False, True, 1)
n = 4; size = 256 << 20
bufs = [h.new_cpu_locked_tensor(size // 4, torch.empty(0, dtype=torch.float32)) for _ in range(n)]
for b in bufs: b.fill_(2.5)
paths = [f"{folder}/a{i}" for i in range(n)]
def measure(label, fn):
    w0, p0 = time.perf_counter(), time.process_time()
    fn()
    w, p = time.perf_counter() - w0, time.process_time() - p0
    print(f"{label}: wall {w:.2f}s process cpu {p:.2f}s ({p/w:.2f} cores) {n*size/w/1e9:.2f} GB/s", flush=True)
def aio_op(op):
    for b, p in zip(bufs, paths): assert getattr(h, op)(b, p, 0) == 0
    # the caller computes meanwhile? no: it waits (as stock's swap calls do)
    h.wait()
io = DirectFileIO(num_threads=2, name="x")
eb = [aligned_buffer(size) for _ in range(2)]
def eng(kind):
    fs = [(io.write if kind == "w" else io.read)(eb[i % 2], paths[i] + ".e", size, 0) for i in range(n)]
    for f in fs: f.result()
aio_op("async_pwrite"); eng("w")
for _ in range(2):
    measure("aio write", lambda: aio_op("async_pwrite")); measure("aio read ", lambda: aio_op("async_pread"))
    measure("eng write", lambda: eng("w")); measure("eng read ", lambda: eng("r"))
# compute beside I/O: a matmul loop timed alone and with aio writes in flight
a = torch.randn(1024, 1024)
def mm(k=60):
    for _ in range(k): a @ a
measure("matmul alone", mm)
def mm_with(op_fn):
    t = threading.Thread(target=op_fn); t.start(); mm(); t.join()
measure("matmul + aio writes", lambda: mm_with(lambda: aio_op("async_pwrite")))
measure("matmul + eng writes", lambda: mm_with(lambda: eng("w")))
measure("matmul alone", mm)
