"""The ZeRO-3 hook probe of cli/calibrate.py (measure_zero3_calls) for each model named, at 2 x 64 tokens, fp32:
    python docs/validate/fp32-2026-11-26-run6/retrospective-hooks/hooks_probe.py gpt2-tiny gpt2-small gpt2-medium"""
import json, sys, time, os
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
sys.path.insert(0, REPO)
import torch
torch.set_num_threads(2)
import transformers; transformers.logging.set_verbosity_error()
from tencache_ds.cli.calibrate import measure_zero3_calls
for m in sys.argv[1:]:
    cfg = json.load(open(os.path.join(REPO, "configs", "models", f"{m}.json")))
    t = time.time()
    r = measure_zero3_calls(torch, cfg, 2, 64, "fp32")
    print("RESULT", m, round(r["call_s"] * 1e3, 3), "ms/use", r["method"], round(time.time() - t, 1), "s", flush=True)
