"""Run 15 recomputed: the predictions the run wrote (the code of 2959234), the committed model with each machine
file's ``io_contention`` renormalised from the rounds its source records (the review's fixes after the run: the
drive's busy seconds within the steps' time alone, ``min(alone, GB / rate)``, and the rate alone with its last
request's bytes counted, x 17/16 at 2 in flight), and the committed model without the term (``io_contention`` 0, the
model before it). Measured: the median of steps 3-7 of both runs of each arm (the bench's own median), and of each
run alone.
Run from the repository root: python docs/validate/fp32-2026-11-30-run15/recompute15.py"""
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import recompute as r  # noqa: E402


def renormalised(machine):
    """The figure the committed probe gives from the same rounds (its source: "(R GB/s alone), ... rounds (A s alone,
    B s beside G GB; ...)")."""
    source = machine.sources["io_contention"]
    rate = float(re.search(r"\(([0-9.]+) GB/s alone\)", source).group(1)) * 17 / 16
    ratios = [(float(beside) - float(alone)) / min(float(alone), float(gb) / rate) for alone, beside, gb in
              re.findall(r"([0-9.]+) s alone, ([0-9.]+) s beside ([0-9.]+) GB", source)]
    return statistics.median(ratios)


print("| configuration | arm | measured: both runs / run 1 / run 2 (s) | predicted (s) | error "
      "| committed, renormalised figure (s) | error | without the term (s) | error |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
counts = {"with": 0, "renormalised": 0, "without": 0}
figures = {}
predictions = r.predictions(HERE)


def columns(name, p):
    machine = r.machine_for(HERE, p["model"])
    figures[p["model"]] = (machine.io_contention, renormalised(machine))
    without, now = (r.predicted_again(machine, p, io_contention=figure) for figure in (0.0, figures[p["model"]][1]))
    return {arm: {"with": p["predicted"][arm]["step_time_s"], "renormalised": now[arm]["step_time_s"],
                  "without": without[arm]["step_time_s"]} for arm in ("stock", "tencache")}


r.print_rows(HERE, columns, counts)
print()
total = 2 * len(predictions)
print(f"Step time within 15%: {counts['with']} of {total} as predicted, {counts['renormalised']} of {total} with the "
      f"committed model and the renormalised figure, {counts['without']} of {total} without the term.")
print("io_contention, the run's / renormalised: " + ", ".join(f"{model} {run:.2f} / {new:.2f}"
                                                              for model, (run, new) in figures.items()))
