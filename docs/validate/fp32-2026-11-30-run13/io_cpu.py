"""CPU time the machine spends per GB of O_DIRECT I/O through DeepSpeed's aio handle (stock's path), nothing else
running: /proc/stat busy jiffies of all cores and the process's own rusage, over wall time. 1 MiB blocks, 8 in
flight, 1 thread (configs/stock-nvme.json's aio block); four 256 MiB files written, read, written, read,
then removed.
Run: python docs/validate/fp32-2026-11-30-run13/io_cpu.py NVME_FOLDER"""
import os, resource, sys, time
import torch
from deepspeed.ops.op_builder import AsyncIOBuilder

def busy():
    f = open("/proc/stat").readline().split()[1:]
    v = list(map(int, f))
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)

def rus():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

folder = sys.argv[1]
block, depth, threads = 1 << 20, 8, 1
h = AsyncIOBuilder().load().aio_handle(block, depth, False, True, threads)
n = 256 << 20
buf = h.new_cpu_locked_tensor(n // 4, torch.empty(0, dtype=torch.float32))  # page-locked, as stock's swap buffers
buf.fill_(1.0)
files = [os.path.join(folder, f"f{i}") for i in range(4)]
hz = os.sysconf("SC_CLK_TCK")
try:
    for kind in ("write", "read", "write", "read"):
        b0, t0, r0, w0 = *busy(), rus(), time.perf_counter()
        for f in files:
            if kind == "write":
                h.async_pwrite(buf, f)
            else:
                h.async_pread(buf, f)
            h.wait()
        b1, t1, r1, w1 = *busy(), rus(), time.perf_counter()
        gb = n * len(files) / 1e9
        print(f"{kind}: {gb:.2f} GB in {w1 - w0:.2f} s ({gb / (w1 - w0):.2f} GB/s); machine busy "
              f"{(b1 - b0) / hz:.2f} cpu-s ({(b1 - b0) / hz / gb:.3f} per GB), process {r1 - r0:.2f} cpu-s "
              f"({(r1 - r0) / gb:.3f} per GB)")
finally:  # the page-locked buffer and the 1 GiB of files go, whatever stopped the loop
    h.free_cpu_locked_tensor(buf)
    for f in files:
        if os.path.exists(f):
            os.remove(f)
