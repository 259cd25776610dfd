import sys, time, os, mmap, ctypes; sys.path.insert(0,"/work/main")
import torch
from tencache_ds.io.direct_io import DirectFileIO, aligned_buffer
MB = 64 << 20
def huge_buffer(n, lock):
    m = mmap.mmap(-1, n + (2<<20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    t = torch.frombuffer(m, dtype=torch.uint8)
    off = (-t.data_ptr()) % (2<<20)
    t = t[off:off+n]; t.fill_(1)
    if lock:
        libc = ctypes.CDLL(None); print("mlock", libc.mlock(ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(n)))
    t._keep = m
    return t
io = DirectFileIO(num_threads=2, name="h")
path = "/tmp/exp/nvme/h.bin"; N = 32
b = aligned_buffer(MB)
for i in range(N): io.write(b, path, MB, i*MB).result()
def run(bufs, mode):
    t = time.perf_counter(); pend = []
    for k in range(N):
        if len(pend) >= 2: pend.pop(0).result()
        pend.append(getattr(io, mode)(bufs[k % 2], path, MB, k*MB))
    for f in pend: f.result()
    return N*MB/(time.perf_counter()-t)/1e9
kinds = {"pageable": [aligned_buffer(MB) for _ in range(2)], "huge": [huge_buffer(MB, False) for _ in range(2)],
         "huge+mlock": [huge_buffer(MB, True) for _ in range(2)]}
for k in kinds.values():
    for x in k: x.fill_(3)
print(open("/proc/meminfo").read().split("AnonHugePages:")[1].split("\n")[0])
for rep in range(3):
    for name, bufs in kinds.items():
        print(rep, name, "read %.2f write %.2f GB/s" % (run(bufs, "read"), run(bufs, "write")), flush=True)
io.close(); os.remove(path)
