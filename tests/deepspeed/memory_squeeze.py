"""scripts/train.py with this process's memory cgroup squeezed after chosen steps, the way a container whose limit
is lowered under a running job (or a neighbour that grows) squeezes it. Run it inside a memory cgroup of its own
(tests/deepspeed/test_memory_pressure_engine.py makes one); every other argument goes to train.py.

    python tests/deepspeed/memory_squeeze.py --squeeze-after 2 --squeeze-to window [--release-after 3] \
        [--limit-at-start 1GB] [train.py arguments]

After each listed step the cgroup's limit is lowered (probes/host_memory.py names the quantities): ``window``, to its
working set (usage less inactive page cache) plus half-way between a step's measured rise and the reserve tencache
keeps available (the next step fits, and tencache must give memory back); ``short``, to its usage without any page
cache plus half a step's rise (even with every page of cache reclaimed the next step cannot fit: tencache must stop
the run before the OOM killer ends it); or to the working set plus a byte size. ``--release-after``: the limit is lifted again
after that step (memory back). ``--limit-at-start``: before the engine is built, the limit is set to the working set
then plus a byte size (a container smaller than the model's state: "auto" starts at a share of it). The squeezes are added to the result JSON under "squeezes", with the working set
after every step ("working_set_bytes").
"""
import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import train  # noqa: E402

from tencache_ds.integrations.deepspeed.memory_pressure import governor_of  # noqa: E402
from tencache_ds.probes.host_memory import cgroup_usage, memory_cgroup_folder  # noqa: E402
from tencache_ds.units import parse_bytes  # noqa: E402

SQUEEZES, WORKING_SETS = [], []


def own_cgroup():
    folder, _root, version = memory_cgroup_folder()
    if folder is None:
        raise SystemExit("memory_squeeze.py: this process is in no memory cgroup it can see")
    return folder, version


def set_limit(limit):
    """Write the own cgroup's limit (None: none); v1 refuses (EBUSY) a limit it cannot reclaim down to at once, so
    a refused limit is raised a little until it is taken. Returns the limit set."""
    folder, version = own_cgroup()
    limit_file = os.path.join(folder, "memory.limit_in_bytes" if version == 1 else "memory.max")
    for _attempt in range(20):
        try:
            with open(limit_file, "w") as handle:
                handle.write(("-1" if version == 1 else "max") if limit is None else str(limit))
            return limit
        except OSError:
            limit += 4 << 20
    raise SystemExit(f"memory_squeeze.py: {limit_file} refuses {limit}")


def squeeze(engine, step, how):
    folder, version = own_cgroup()
    policy = governor_of(engine.optimizer).policy if how in ("window", "short") else None
    working_set, unreclaimable = cgroup_usage(folder, version)
    if how == "window":
        rise = policy.step_rise_bytes
        base, headroom = working_set, (rise + policy.reserve_bytes(working_set + rise)) // 2
    elif how == "short":
        base, headroom = unreclaimable, policy.step_rise_bytes // 2
    else:
        base, headroom = working_set, parse_bytes(how)
    limit = set_limit(base + headroom)
    SQUEEZES.append({"after_step": step, "working_set_bytes": working_set, "unreclaimable_bytes": unreclaimable,
                     "headroom_bytes": headroom, "limit_bytes": limit,
                     "rise_bytes": policy.step_rise_bytes if policy else None})
    train.log0(f"squeezed after step {step}: limit {limit} = {base} + headroom {headroom} (working set "
               f"{working_set}, without page cache {unreclaimable})")


def main(argv):
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--squeeze-after", default="")
    parser.add_argument("--squeeze-to", default="window")
    parser.add_argument("--release-after", type=int, default=None)
    parser.add_argument("--limit-at-start", default=None,
                        help="before the engine is built, limit the cgroup to its working set now plus this size")
    ours, rest = parser.parse_known_args(argv)
    if ours.limit_at_start is not None:
        working_set = cgroup_usage(*own_cgroup())[0]
        limit = set_limit(working_set + parse_bytes(ours.limit_at_start))
        SQUEEZES.append({"after_step": None, "working_set_bytes": working_set, "limit_bytes": limit})
        train.log0(f"limited at start: {limit} = working set {working_set} + {ours.limit_at_start}")
    after = {int(step) for step in ours.squeeze_after.split(",") if step}
    original_train_step, step_counter = train.train_step, [0]

    def train_step_then_squeeze(engine, batches, grad_accum, *options):
        loss = original_train_step(engine, batches, grad_accum, *options)
        WORKING_SETS.append(cgroup_usage(*own_cgroup())[0])
        if step_counter[0] in after:
            squeeze(engine, step_counter[0], ours.squeeze_to)
        if step_counter[0] == ours.release_after:
            set_limit(None)
            train.log0(f"released after step {step_counter[0]}: no limit")
        step_counter[0] += 1
        return loss

    original_write_result = train.write_result

    def write_result_with_squeezes(path, result):
        result.update(squeezes=SQUEEZES, working_set_bytes=WORKING_SETS)
        original_write_result(path, result)

    train.train_step, train.write_result = train_step_then_squeeze, write_result_with_squeezes
    return train.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
