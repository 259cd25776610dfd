"""Run 21 (docs/estimate.md): stock's reduce at one rank on 124 M fp32 elements, timed apart: the concatenation, the
pre-divide, gloo's reduce_scatter_tensor at world size 1, and fresh and mapped writes of the same size."""
import os, time, torch, torch.distributed as dist
torch.set_num_threads(2)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29633")
dist.init_process_group("gloo", rank=0, world_size=1)
n = 124_000_000
for trial in range(4):
    x = torch.ones(n)
    t = time.perf_counter(); y = torch.cat([x[:n//2], x[n//2:]]); t1 = time.perf_counter()
    y.div_(1); t2 = time.perf_counter()
    dist.reduce_scatter_tensor(y, y); t3 = time.perf_counter()
    z = torch.empty(n); z.copy_(y); t4 = time.perf_counter()
    z2 = torch.empty(n); z2.fill_(1); t5 = time.perf_counter(); z2.copy_(y); t6 = time.perf_counter()
    print(f"cat {t1-t:.3f} div {t2-t1:.3f} rs {t3-t2:.3f} fresh-copy {t4-t3:.3f} fill-fresh {t5-t4:.3f} copy-mapped {t6-t5:.3f}")
    del y, z, z2
dist.destroy_process_group()
