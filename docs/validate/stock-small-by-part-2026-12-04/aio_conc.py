import os, sys, time, torch
from deepspeed.ops.op_builder import AsyncIOBuilder
folder = sys.argv[1]; tensor_bytes = int(sys.argv[2]); count = 4; rounds = int(sys.argv[3])
os.makedirs(folder, exist_ok=True)
aio = AsyncIOBuilder().load(verbose=False)
h = aio.aio_handle(1 << 20, 8, False, True, 1)
bufs = [h.new_cpu_locked_tensor(tensor_bytes // 4, torch.empty(0, dtype=torch.float32)) for _ in range(count)]
for i, b in enumerate(bufs): b.fill_(i + 1.5)
paths = [os.path.join(folder, f"t{i}.bin") for i in range(count)]
def run(op, group):
    t = time.perf_counter()
    for s in range(0, count, group):
        for b, p in zip(bufs[s:s+group], paths[s:s+group]): assert getattr(h, op)(b, p, 0) == 0
        assert h.wait() == min(group, count - s)
    return tensor_bytes * count / (time.perf_counter() - t) / 1e9
run("async_pwrite", 4)
for k in range(rounds):
    print(" ".join(f"{op[6:]}x{g} {run(op, g):.2f}" for g in (1, 2, 4) for op in ("async_pwrite", "async_pread")), flush=True)
