import time, torch
from deepspeed.ops.op_builder import AsyncIOBuilder
aio = AsyncIOBuilder().load(verbose=False)
hs = [aio.aio_handle(1 << 20, 8, False, True, 1) for _ in range(4)]
b = hs[0].new_cpu_locked_tensor(1 << 20, torch.empty(0, dtype=torch.float32))
hs[0].async_pwrite(b, "/tmp/aioexp/idle.bin", 0); hs[0].wait()
p0, w0 = time.process_time(), time.perf_counter(); time.sleep(3)
print("idle process cpu over 3 s:", round(time.process_time() - p0, 3))
