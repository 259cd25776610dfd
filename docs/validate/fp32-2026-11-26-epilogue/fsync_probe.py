import os, time, torch
from tencache_ds.io.direct_io import DirectFileIO
from tencache_ds.io.drive_rate import aligned_buffer
folder="/tmp/tencache-bench-nvme"; os.makedirs(folder, exist_ok=True)
path=os.path.join(folder,"wprobe.bin")
req=64<<20; n=32
io=DirectFileIO(num_threads=2, name="p")
bufs=[aligned_buffer(torch, req) for _ in range(2)]
def run(sync, write=True):
    t=time.perf_counter(); pend=[]
    for i in range(n):
        if len(pend)>=2: pend.pop(0).result()
        pend.append((io.write if write else io.read)(bufs[i%2], path, req, i*req))
    for f in pend: f.result()
    t1=time.perf_counter()
    if sync:
        fd=os.open(path, os.O_RDONLY); os.fsync(fd); os.close(fd)
    return n*req/(t1-t)/1e9, n*req/(time.perf_counter()-t)/1e9
run(False)
for trial in range(3):
    print("nosync", run(False)); print("sync", run(True)); print("read", run(False, False))
io.close(); os.remove(path)
