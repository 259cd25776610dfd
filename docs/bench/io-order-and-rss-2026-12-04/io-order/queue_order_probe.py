"""With reads-first.patch applied: 2K tensors of 405 MB through one engine of 2 threads (the optimizer store's),
reads alone, writes alone, and a write then a read submitted in turn (one engine, then reads and writes on two).
    TENCACHE_IO_ORDER=fifo|reads_first|split K=8 python queue_order_probe.py   (files under /tmp/drv/files)
"""
import time, torch, os, sys
sys.path.insert(0, "/work/main")
from tencache_ds.io.direct_io import DirectFileIO
N = 405_000_000 // 4
K = int(os.environ.get("K", 6))
d = "/tmp/drv/files"; os.makedirs(d, exist_ok=True)
io = DirectFileIO(num_threads=2)
bufs = [torch.empty(N, dtype=torch.float32) for _ in range(2*K)]
for b in bufs: b.fill_(1.0)
paths_r = [f"{d}/r{i}" for i in range(K)]; paths_w = [f"{d}/w{i}" for i in range(K)]
for i in range(K):
    io.write(bufs[i], paths_r[i]).result(); io.write(bufs[K+i], paths_w[i]).result()
os.system("sync")
def t_reads():
    t=time.perf_counter(); fs=[io.read(bufs[i], paths_r[i]) for i in range(K)]; [f.result() for f in fs]; return time.perf_counter()-t
def t_writes():
    t=time.perf_counter(); fs=[io.write(bufs[K+i], paths_w[i]) for i in range(K)]; [f.result() for f in fs]; return time.perf_counter()-t
def t_both(io2=None):
    t=time.perf_counter(); rfs=[]; wfs=[]
    for i in range(K):
        wfs.append((io2 or io).write(bufs[K+i], paths_w[i])); rfs.append(io.read(bufs[i], paths_r[i]))
    [f.result() for f in rfs]; tr=time.perf_counter()-t; [f.result() for f in wfs]; return tr, time.perf_counter()-t
io2 = DirectFileIO(num_threads=2)
for rep in range(3):
    r=t_reads(); w=t_writes(); b=t_both(); b2=t_both(io2)
    G=K*405e6/1e9
    print(f"reads {G/r:.2f} GB/s  writes {G/w:.2f} GB/s  both(one engine): reads done {b[0]:.2f}s all {b[1]:.2f}s ({2*G/b[1]:.2f} GB/s)  both(two engines): reads {b2[0]:.2f}s all {b2[1]:.2f}s;  reads alone {r:.2f}s writes alone {w:.2f}s")
