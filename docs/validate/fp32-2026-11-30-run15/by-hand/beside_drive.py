"""By hand, 2026-11-30 (thirty-eighth session; output.txt beside it): how much slower compute runs per GB of I/O
beside it, tencache's engine against DeepSpeed's aio handle. Compute: a 1536 x 1536 matrix product 60 times
(``matmul``), or 5 forward + backward steps of gpt2-small's probe layers (``layers``: 10 of 12, vocabulary 1024).
Run: python beside_drive.py matmul|layers (its files in /tmp/exp/nv, removed at the end)."""
import os, sys, time, threading, statistics
import torch
sys.path.insert(0, "/work/main")
from tencache_ds.io.direct_io import DirectFileIO
from tencache_ds.io.drive_rate import aligned_buffer
folder = "/tmp/exp/nv"; os.makedirs(folder, exist_ok=True)
torch.set_num_threads(2)
a = torch.randn(1536, 1536); b = torch.randn(1536, 1536)
if sys.argv[1:] == ["layers"]:
    import json
    from tencache_ds.cli import calibrate as c
    cfg = json.load(open("/work/main/configs/models/gpt2-small.json"))
    st = c._training_step(torch, c._probe_model(torch, cfg, 10, 1024, "fp32"), 1024, 2, 64)
    work, n = st, 5
else:
    work, n = (lambda: a @ b), 60
def compute():
    t = time.perf_counter()
    for _ in range(n): work()
    return time.perf_counter() - t
REQ = 64 << 20; NFILE = 8
path = os.path.join(folder, "f.bin")
io = DirectFileIO(num_threads=2)
bufs = [aligned_buffer(torch, REQ) for _ in range(2)]
for x in bufs: x.fill_(1)
for i in range(NFILE): io.write(bufs[0], path, REQ, i * REQ).result()
def engine_loop(stop, moved, mode):
    i = 0; pend = []
    while not stop.is_set():
        buf = bufs[i % 2]
        f = (io.write if (mode == "write" or (mode == "mix" and i % 2)) else io.read)(buf, path, REQ, (i % NFILE) * REQ)
        pend.append(f)
        if len(pend) >= 2:
            pend.pop(0).result(); moved[0] += REQ
        i += 1
    for f in pend: f.result(); moved[0] += REQ
from deepspeed.ops.op_builder import AsyncIOBuilder
h = AsyncIOBuilder().load().aio_handle(1 << 20, 8, False, True, 1)
lb = h.new_cpu_locked_tensor(REQ // 4, torch.empty(0, dtype=torch.float32)); lb.fill_(1.0)
dpaths = [os.path.join(folder, f"d{i}") for i in range(4)]
for p in dpaths: h.async_pwrite(lb, p); h.wait()
def aio_loop(stop, moved, mode):
    i = 0
    while not stop.is_set():
        p = dpaths[i % 4]
        if mode == "write" or (mode == "mix" and i % 2): h.async_pwrite(lb, p)
        else: h.async_pread(lb, p)
        h.wait(); moved[0] += REQ; i += 1
def with_io(loop, mode):
    stop = threading.Event(); moved = [0]
    th = threading.Thread(target=loop, args=(stop, moved, mode)); th.start()
    time.sleep(0.05)
    m0 = moved[0]; t = compute(); m1 = moved[0]
    stop.set(); th.join()
    return t, (m1 - m0)
for _ in range(3): compute()
res = {k: [] for k in ["alone", "engine-read", "engine-write", "aio-read", "aio-write"]}
for r in range(4):
    res["alone"].append((compute(), 0))
    res["engine-read"].append(with_io(engine_loop, "read"))
    res["engine-write"].append(with_io(engine_loop, "write"))
    res["aio-read"].append(with_io(aio_loop, "read"))
    res["aio-write"].append(with_io(aio_loop, "write"))
    res["alone"].append((compute(), 0))
base = statistics.median(t for t, _ in res["alone"])
print(f"alone median {base:.3f} s  all {[round(t,3) for t,_ in res['alone']]}")
for k, v in res.items():
    if k == "alone": continue
    per = [ (t - base) / (m / 1e9) for t, m in v if m]
    print(k, "t", [round(t, 3) for t, _ in v], "GB", [round(m / 1e9, 2) for _, m in v], "s/GB",
          [round(x, 3) for x in per], "median", round(statistics.median(per), 3))
h.free_cpu_locked_tensor(lb)
io.close()
for f in os.listdir(folder): os.remove(os.path.join(folder, f))
