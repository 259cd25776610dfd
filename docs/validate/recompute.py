"""What the validation runs' recompute scripts (docs/validate/*/recompute*.py) share: a run folder's saved predictions
and machine files, a configuration predicted again on a changed machine, each arm's measured steps, and the 15%
test. Each script says what it changes and why; this module only reads a run's folder."""
import dataclasses
import json
import os
import re
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [REPO, os.path.join(REPO, "scripts")]
import validate_estimate  # noqa: E402
from tencache_ds.plan.machine import load_machine  # noqa: E402

WARMUP = 3  # the bench's warm-up steps: its median is of the steps after them
MACHINE_FILES = {"gpt2-tiny": "machine.json", "gpt2-small": "machine-gpt2-small.json",
                 "gpt2-medium": "machine-gpt2-medium.json"}


def predictions(folder):
    """{configuration: its saved prediction} of the run in ``folder`` (predictions.json, written before the runs)."""
    with open(os.path.join(folder, "predictions.json")) as handle:
        return json.load(handle)["predictions"]


def machine_for(folder, model, files=None):
    """The machine file the run calibrated for ``model`` (``files``: model -> file name, where the run's differ)."""
    return load_machine(os.path.join(folder, (files or MACHINE_FILES)[model]))


def predicted_again(machine, prediction, **changes):
    """The configuration of ``prediction`` predicted on ``machine`` with ``changes`` (Machine fields), at the runs'
    shape: micro-batch 2 x 64 tokens, no activation checkpointing, fp32."""
    return validate_estimate.predict_configuration(dataclasses.replace(machine, **changes), prediction["model"],
                                                   prediction["config"], prediction["host_cache_bytes"], 2, 64,
                                                   False, dtype="fp32")


def compute_figure(machine, statistic):
    """The FLOP/s the compute probe's source records beside its figure: ``statistic`` "from the medians" or "from the
    fastest steps"."""
    found = re.search(statistic + r": [0-9.]+ s, ([0-9.]+) GFLOP/s", machine.sources["accelerator_flops_per_s"])
    return float(found.group(1)) * 1e9


def measured_steps(folder, configuration, arm, run):
    """The step times of one run of one arm after the bench's warm-up."""
    result = validate_estimate.read_json(os.path.join(folder, configuration, f"{arm}-{run}.result.json"))
    return [step["time_s"] for step in result["steps"][WARMUP:]]


def print_rows(folder, columns, counts):
    """Print each configuration's arms as a table row: the measured medians (both runs / run 1 / run 2), then each
    column's prediction and its error; ``counts[column]`` gains the rows within 15%. ``columns(name, prediction)``
    gives {arm: {column: predicted seconds}}, the columns in the table's order."""
    for name, prediction in predictions(folder).items():
        by_arm = columns(name, prediction)
        for arm in ("stock", "tencache"):
            one, two = measured_steps(folder, name, arm, 1), measured_steps(folder, name, arm, 2)
            measured = statistics.median(one + two)
            cells = ""
            for column, predicted in by_arm[arm].items():
                counts[column] += within(predicted, measured)
                cells += error(predicted, measured)
            print(f"| {name} | {arm} | {measured:.3f} / {statistics.median(one):.3f} / {statistics.median(two):.3f} "
                  f"{cells}|")


def within(predicted, measured, tolerance=0.15):
    return abs(predicted / measured - 1) <= tolerance


def error(predicted, measured):
    """A table's two cells: the prediction and its error against the measurement."""
    return f"| {predicted:.3f} | {100 * (predicted / measured - 1):+.0f}% "
