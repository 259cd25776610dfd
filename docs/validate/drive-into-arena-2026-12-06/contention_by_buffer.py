"""Layers' slowdown beside the drive reading vs writing vs both (experiment)."""
import json, os, sys, threading, time, statistics
import torch
sys.path.insert(0, "/work/main")
from tencache_ds.cli import calibrate as C
from tencache_ds.io.direct_io import DirectFileIO, aligned_buffer
from tencache_ds.io.drive_rate import TENSOR_REQUEST_BYTES, trial_file

cfg = json.load(open("/work/main/configs/models/gpt2-small.json"))
layers = C.probe_layers(cfg, 4)
vocab = min(int(cfg.get("vocab_size", C.CALIBRATION_VOCAB)), C.CALIBRATION_VOCAB)
step = C._training_step(torch, C._probe_model(torch, cfg, layers, vocab, "fp32"), vocab, 2, 64)
folder = "/tmp/exp/nvme"; os.makedirs(folder, exist_ok=True)
path = trial_file(folder, "contention")
io = DirectFileIO(num_threads=2, name="exp")
import mmap
def huge(n):
    m = mmap.mmap(-1, n); m.madvise(mmap.MADV_HUGEPAGE)
    t = torch.frombuffer(m, dtype=torch.uint8); t.fill_(1); return t
KIND = sys.argv[2]
bufs = [huge(TENSOR_REQUEST_BYTES) if KIND == "huge" else aligned_buffer(TENSOR_REQUEST_BYTES) for _ in range(2)]
N = 4
for i in range(N):
    bufs[0].fill_(i + 1); io.write(bufs[0], path, TENSOR_REQUEST_BYTES, i * TENSOR_REQUEST_BYTES).result()

def keep(mode, done, moved):
    pending, i = [], 0
    while not done():
        d = mode if mode != "mixed" else ("read" if i % 2 == 0 else "write")
        f = getattr(io, d)(bufs[i % 2], path, TENSOR_REQUEST_BYTES, (i % N) * TENSOR_REQUEST_BYTES)
        pending.append(f); i += 1
        if len(pending) >= 2:
            pending.pop(0).result(); moved[0] += TENSOR_REQUEST_BYTES
    for f in pending:
        f.result(); moved[0] += TENSOR_REQUEST_BYTES

def rate(mode):
    moved = [0]; t = time.perf_counter()
    keep(mode, lambda: moved[0] >= 16 * TENSOR_REQUEST_BYTES, moved)
    return moved[0] / (time.perf_counter() - t)

def timed(steps, mode):
    stop, moved = threading.Event(), [0]
    th = threading.Thread(target=keep, args=(mode, stop.is_set, moved), daemon=True) if mode else None
    if th: th.start()
    t = time.perf_counter()
    for _ in range(steps): step()
    s = time.perf_counter() - t
    stop.set()
    if th: th.join()
    return s, moved[0]

step(); t = time.perf_counter(); step(); one = time.perf_counter() - t
steps = int(2.0 / one) + 1
res = {m: [] for m in ("read", "write", "mixed")}
rates = {m: rate(m) for m in res}
print("rates GB/s", {m: round(r / 1e9, 2) for m, r in rates.items()}, "steps", steps, flush=True)
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    for m in res:
        a, _ = timed(steps, None); b, moved = timed(steps, m)
        busy = min(a, moved / rates[m])
        res[m].append(max(0, b - a) / busy)
        print(rnd, m, f"alone {a:.2f} beside {b:.2f} moved {moved/1e9:.2f} GB ratio {res[m][-1]:.2f}", flush=True)
print({m: round(statistics.median(v), 2) for m, v in res.items()})
io.close(); os.remove(path)
