"""The compute probe's spread (run 12, 15:30 UTC): gpt2-medium fp32, micro-batch 2 x 64, 6 layers with the vocabulary
cut and real, and the whole model bare, 10 timed steps each after 4; fastest and median. Run from the repository
root: python docs/validate/fp32-2026-11-30-run12-subset/probe_spread.py (output: probe_spread.txt)."""
import json, time, statistics as st, torch, sys
sys.path.insert(0, '.')
from tencache_ds.cli import calibrate as c
cfg = json.load(open('configs/models/gpt2-medium.json'))
torch.manual_seed(0)
res = {}
for name, layers, vocab in [('6L-v1024', 6, 1024), ('6L-vfull', 6, 50257), ('24L-vfull', 24, 50257)]:
    m = c._probe_model(torch, cfg, layers, vocab, 'fp32')
    step = c._training_step(torch, m, vocab, 2, 64)
    for _ in range(4): step()
    t = []
    for _ in range(10):
        s = time.perf_counter(); step(); t.append(time.perf_counter() - s)
    res[name] = t
    print(name, 'min %.3f median %.3f max %.3f' % (min(t), st.median(t), max(t)), ' '.join('%.3f' % x for x in t), flush=True)
    del m, step
l_min = res['6L-v1024']; 
for f in (min, st.median):
    head = f(res['6L-vfull']) - f(res['6L-v1024']); layer = f(res['6L-v1024']) / 6
    print(f.__name__, 'predicted full', head + 24 * layer, 'measured full', f(res['24L-vfull']))
