"""Run 14 (a subset, the first with the compute figure from the probe's medians) recomputed with the fastest steps'
figure, which the calibration at 20:04 UTC wrote beside it ("from the fastest steps: ..." in the machine file's
compute source). Measured: the bench's median (steps 3-7). Run from the repository root:
python docs/validate/fp32-2026-11-30-run14-subset/recompute14.py"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import recompute as r  # noqa: E402

machine = r.machine_for(HERE, "gpt2-small", {"gpt2-small": "machine.json"})
fastest_flops = r.compute_figure(machine, "from the fastest steps")
print("| configuration | arm | measured (s) | predicted, medians' figure (s) | error | predicted, fastest steps' "
      "figure (s) | error |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for name, p in r.predictions(HERE).items():
    other = r.predicted_again(machine, p, accelerator_flops_per_s=fastest_flops)
    measured = r.validate_estimate.measured_from_bench(os.path.join(HERE, name))["arms"]
    for arm in ("stock", "tencache"):
        m, before, after = measured[arm]["step_time_s"], p["predicted"][arm]["step_time_s"], other[arm]["step_time_s"]
        print(f"| {name} | {arm} | {m:.3f} {r.error(before, m)}{r.error(after, m)}|")
