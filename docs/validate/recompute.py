"""What the validation runs' recompute scripts (docs/validate/*/recompute*.py) share: a run folder's saved predictions
and machine files, a configuration predicted again on a changed machine, each arm's measured steps, and the 15%
test. Each script says what it changes and why; this module only reads a run's folder."""
import dataclasses
import json
import os
import re
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
    with open(os.path.join(folder, configuration, f"{arm}-{run}.result.json")) as handle:
        return [step["time_s"] for step in json.load(handle)["steps"][WARMUP:]]


def within(predicted, measured, tolerance=0.15):
    return abs(predicted / measured - 1) <= tolerance


def error(predicted, measured):
    """A table's two cells: the prediction and its error against the measurement."""
    return f"| {predicted:.3f} | {100 * (predicted / measured - 1):+.0f}% "
