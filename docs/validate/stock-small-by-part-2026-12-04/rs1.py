import os, time, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
dist.init_process_group("gloo", rank=0, world_size=1)
n = 124_439_808
for trial in range(4):
    grads = torch.randn(n)  # the bucket (flat)
    t = time.perf_counter()
    out = torch.empty(n)
    dist.reduce_scatter_tensor(out, grads)
    t1 = time.perf_counter() - t
    t = time.perf_counter(); out2 = torch.empty(n); out2.copy_(grads); t2 = time.perf_counter() - t
    t = time.perf_counter(); z = torch.zeros_like(grads); t3 = time.perf_counter() - t
    print(f"reduce_scatter {t1:.3f}s  fresh copy {t2:.3f}s  zeros_like {t3:.3f}s", flush=True)
    del out, out2, z
