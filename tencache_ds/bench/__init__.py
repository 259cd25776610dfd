"""Benchmark reporting: stock DeepSpeed against tencache_ds, from the result files scripts/train.py writes.

Owns: turning result dicts into a comparison (report.py). Does not own: running anything (tencache_ds/cli/bench.py
launches the training runs). Imports neither torch nor deepspeed.
"""
