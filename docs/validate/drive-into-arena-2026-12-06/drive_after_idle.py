import sys, time, os; sys.path.insert(0,"/work/main")
from tencache_ds.io.direct_io import DirectFileIO, aligned_buffer
from tencache_ds.io.activity import IoActivity
act = IoActivity()
io = DirectFileIO(num_threads=2, name="b", activity=act)
MB = 64 << 20
bufs = [aligned_buffer(MB) for _ in range(2)]
path = "/tmp/exp/nvme/burst.bin"
N = 48  # 3 GiB file
for i in range(N):
    bufs[0].fill_(i+1); io.write(bufs[0], path, MB, i*MB).result()
def run(nreq, mode="read", start=0):
    b0 = act.totals()[0]; t = time.perf_counter(); pend = []
    for k in range(nreq):
        if len(pend) >= 2: pend.pop(0).result()
        f = getattr(io, mode)(bufs[k % 2], path, MB, ((start + k) % N) * MB)
        pend.append(f)
    for f in pend: f.result()
    wall = time.perf_counter() - t; busy = act.totals()[0] - b0
    return nreq * MB / wall / 1e9, nreq * MB / busy / 1e9
print("saturated read 3 GiB: wall %.2f busy %.2f GB/s" % run(48))
print("saturated write 3 GiB: wall %.2f busy %.2f GB/s" % run(48, "write"))
for idle in (2.0, 1.0, 0.5, 0.25):
    res = []
    for rep in range(4):
        time.sleep(idle)
        res.append(run(4, "read", rep * 8))
    print(f"after {idle}s idle, 256 MiB read:", " ".join(f"{w:.2f}/{b:.2f}" for w, b in res))
for idle in (1.0, 0.5):
    res = []
    for rep in range(4):
        time.sleep(idle)
        res.append(run(4, "write", rep * 8))
    print(f"after {idle}s idle, 256 MiB write:", " ".join(f"{w:.2f}/{b:.2f}" for w, b in res))
# duty cycle: 50% busy pattern, 1 GiB chunks
res=[]
for rep in range(4):
    w,b = run(16, "read", rep*16); res.append((w,b)); time.sleep(16*MB/ (w*1e9))
print("1 GiB reads at ~50% duty:", " ".join(f"{w:.2f}/{b:.2f}" for w, b in res))
io.close(); os.remove(path)
