import os, time, torch, torch.distributed as dist
os.environ.setdefault("MASTER_ADDR","127.0.0.1"); os.environ.setdefault("MASTER_PORT","29533")
dist.init_process_group("gloo", rank=0, world_size=1)
n = 124_000_000
# gpt2-small-ish param list: 148 tensors
sizes = [38597376, 786432] + [768*2304, 2304, 768*768, 768, 768*3072, 3072, 3072*768, 768, 768, 768, 768, 768]*12
sizes = sizes[:]
grads = [torch.randn(s) for s in sizes]
N = sum(sizes); print("elements", N)
bucket = torch.empty(N); persist = torch.empty(N)
def t(f, reps=3):
    best = 1e9
    for _ in range(reps):
        t0=time.perf_counter(); r=f(); best=min(best,time.perf_counter()-t0)
    return best, r
def bucket_copy():
    off=0
    for g in grads:
        bucket.narrow(0,off,g.numel()).copy_(g); off+=g.numel()
tb,_=t(bucket_copy); print("bucket copy", tb, "GB/s(r+w)", 8*N/tb/1e9)
views=[]; off=0
for g in grads: views.append(bucket.narrow(0,off,g.numel())); off+=g.numel()
tc,flat=t(lambda: torch.cat(views)); print("cat (fresh)", tc)
td,_=t(lambda: flat.div_(1)); print("div_", td, 8*N/td/1e9)
out = torch.chunk(flat,1)[0]
tr,_=t(lambda: dist.reduce_scatter_tensor(out, flat)); print("reduce_scatter_tensor", tr)
tp,_=t(lambda: persist.copy_(flat)); print("partition copy", tp, 8*N/tp/1e9)
def norms():
    for v in views: (v.to(torch.float64).norm(2)**2.0)**0.5
tn,_=t(norms); print("norm float64", tn)
def cast64():
    for v in views: v.to(torch.float64)
t6,_=t(cast64); print("  of which cast", t6)
big=torch.empty(64*1024*1024); src=torch.randn(64*1024*1024)
tcopy,_=t(lambda: big.copy_(src)); print("host copy probe-like GB/s", 8*big.numel()/tcopy/1e9)
