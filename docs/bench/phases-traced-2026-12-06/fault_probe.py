import time, torch, resource, os
torch.set_num_threads(2)
def run(n=40, mb=64):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt; t = time.perf_counter()
    for _ in range(n):
        x = torch.empty(mb << 18); x.fill_(1.0); del x
    dt = time.perf_counter() - t
    return dt, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0, n * mb / 1024
run(4)
dt, flt, gib = run()
print(os.environ.get("THP_MEM_ALLOC_ENABLE"), f"{gib:.1f} GiB fresh in {dt:.2f} s = {gib/dt:.2f} GiB/s, faults {flt}")
x = torch.empty(64 << 18); t = time.perf_counter()
for _ in range(40): x.fill_(1.0)
print(f"refill same buffer: {2.5/(time.perf_counter()-t):.2f} GiB/s")
