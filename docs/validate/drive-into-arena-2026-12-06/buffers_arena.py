import sys, time, os, mmap; sys.path.insert(0,"/work/main")
import torch
from tencache_ds.io.direct_io import DirectFileIO, aligned_buffer
from tencache_ds.memory.arena import PinnedArena
MB = 64 << 20
def huge(n, align):
    m = mmap.mmap(-1, n + (2<<20)); m.madvise(mmap.MADV_HUGEPAGE)
    t = torch.frombuffer(m, dtype=torch.uint8)
    off = (-t.data_ptr()) % (2<<20) if align else 4096 - t.data_ptr() % 4096 if t.data_ptr() % 4096 else 0
    t = t[off:off+n]; t.fill_(1); t._m = m; return t
arena = PinnedArena({MB: 2}, lock="best_effort", register_with_cuda=False)
slots = [arena.alloc(MB) for _ in range(2)]
print("arena slot offsets mod 2MiB", [s.ptr % (2<<20) for s in slots])
kinds = {"torch": [aligned_buffer(MB) for _ in range(2)], "huge-unaligned": [huge(MB, False) for _ in range(2)],
         "huge-aligned": [huge(MB, True) for _ in range(2)], "arena": [s.as_tensor(torch.uint8, MB) for s in slots]}
for k in kinds.values():
    for x in k: x.fill_(3)
io = DirectFileIO(num_threads=2, name="h"); path = "/tmp/exp/nvme/h.bin"; N = 32
for i in range(N): io.write(kinds["torch"][0], path, MB, i*MB).result()
def run(bufs, mode):
    t = time.perf_counter(); pend = []
    for k in range(N):
        if len(pend) >= 2: pend.pop(0).result()
        pend.append(getattr(io, mode)(bufs[k % 2], path, MB, k*MB))
    for f in pend: f.result()
    return N*MB/(time.perf_counter()-t)/1e9
for rep in range(3):
    for name, bufs in kinds.items():
        print(rep, name, "read %.2f write %.2f GB/s" % (run(bufs, "read"), run(bufs, "write")), flush=True)

def smaps_for(ptr):
    cur = None; out = {}
    for line in open("/proc/self/smaps"):
        parts = line.split()
        if "-" in parts[0] and len(parts) >= 5 and all(c in "0123456789abcdef-" for c in parts[0]):
            a, b = (int(x, 16) for x in parts[0].split("-")); cur = a <= ptr < b
        elif cur and parts[0] in ("Rss:", "AnonHugePages:", "Locked:", "VmFlags:"):
            out[parts[0]] = " ".join(parts[1:])
    return out
for name, bufs in kinds.items():
    print(name, smaps_for(bufs[0].data_ptr()))
io.close(); os.remove(path)
