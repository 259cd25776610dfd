"""Run 21 (docs/estimate.md): 2 steps of gpt2-small's probe layers alone, then with K x 10 MiB requests issued just
before them, through tencache's engine or DeepSpeed's aio handle (stock's aio settings), waited after them; prints
the seconds lost per second the drive is busy alone. python3 handle_contention.py tc-read|ds-read|tc-write|ds-write
[K] [FILE]"""
import json, os, sys, time, statistics
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
import torch
torch.set_num_threads(2)
sys.path.insert(0, REPO)
from tencache_ds.cli import calibrate as C
from deepspeed.ops.op_builder import AsyncIOBuilder
from tencache_ds.io.direct_io import DirectFileIO
from tencache_ds.io.drive_rate import aligned_buffer
cfg = json.load(open(os.path.join(REPO, "configs", "models", "gpt2-small.json")))
layers = C.probe_layers(cfg, 4); vocab = min(cfg["vocab_size"], C.CALIBRATION_VOCAB)
step = C._training_step(torch, C._probe_model(torch, cfg, layers, vocab, "fp32"), vocab, 2, 64)
REQ = 10 << 20; N = 64; path = sys.argv[3] if len(sys.argv) > 3 else "/tmp/handle-contention.bin"  # a file on the drive
if not os.path.exists(path):
    with open(path, "wb") as f:
        for _ in range(N):
            f.write(os.urandom(1 << 20) * 10)
    os.sync()
mode = sys.argv[1]; K = int(sys.argv[2]) if len(sys.argv) > 2 else 40
bufs = [aligned_buffer(torch, REQ) for _ in range(K)]
aio = AsyncIOBuilder().load(); h = aio.aio_handle(1048576, 8, False, True, 1)
io = DirectFileIO(num_threads=4, name="x")
def submit(i):
    if mode == "ds-read": return [h.async_pread(b, path, ((i + k) % N) * REQ) for k, b in enumerate(bufs)]
    if mode == "ds-write": return [h.async_pwrite(b, path + ".w%d" % k, 0) for k, b in enumerate(bufs)]
    if mode == "tc-read": return [io.read(b, path, REQ, ((i + k) % N) * REQ) for k, b in enumerate(bufs)]
    if mode == "tc-write": return [io.write(b, path + ".w%d" % k, REQ, 0) for k, b in enumerate(bufs)]
def finish(fs):
    if mode.startswith("ds"): h.wait()
    else: [f.result() for f in fs]
def remove_files():  # the data file and the written ones: nothing reads them after this run
    for name in [path] + [path + ".w%d" % k for k in range(K)]:
        try:
            os.remove(name)
        except FileNotFoundError:
            pass
try:
  step(); step()
  # drive alone
  s = time.perf_counter(); finish(submit(0)); drive_s = time.perf_counter() - s
  s = time.perf_counter(); finish(submit(7)); drive_s = min(drive_s, time.perf_counter() - s)
  res = []
  for r in range(4):
      s = time.perf_counter(); step(); step(); alone = time.perf_counter() - s
      fs = submit(r * 3); s = time.perf_counter(); step(); step(); beside = time.perf_counter() - s
      s2 = time.perf_counter(); finish(fs); tail = time.perf_counter() - s2
      busy = min(alone, drive_s)
      res.append((beside - alone) / busy)
      print(f"{mode}: alone {alone:.2f}s beside {beside:.2f}s drive-alone {drive_s:.2f}s ({K*REQ/drive_s/1e9:.2f} GB/s) tail {tail:.2f} ratio {res[-1]:.2f}", flush=True)
  print(mode, "median", round(statistics.median(res), 2))
finally:
  io.close()
  remove_files()
