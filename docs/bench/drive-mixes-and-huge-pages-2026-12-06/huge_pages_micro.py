"""60 fresh 105 MB matrix products (a gpt2-2.7b layer's weight gradient) against the same products into one buffer,
with and without torch's THP_MEM_ALLOC_ENABLE=1 (huge pages for its CPU allocations of 2 MiB and more):
python huge_pages_micro.py; THP_MEM_ALLOC_ENABLE=1 python huge_pages_micro.py"""
import torch, time, resource
torch.set_num_threads(2)
a = torch.randn(32, 2560); 
w = torch.randn(32, 10240)
def run():
    t=time.perf_counter(); n=0
    for i in range(60):
        g = w.t() @ a   # 10240x2560 fp32 = 105 MB, fresh each time
        n += g.numel()
        del g
    return time.perf_counter()-t
run()
r0=resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t=run()
r1=resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(f"60 x 105MB mm outputs: {t:.2f}s, minor faults {r1-r0}")
out = torch.empty(10240, 2560)
def run2():
    t=time.perf_counter()
    for i in range(60):
        torch.mm(w.t(), a, out=out)
    return time.perf_counter()-t
run2(); print(f"into one buffer: {run2():.2f}s")
