"""Reproduces the table "Host memory that shrinks mid-run" in docs/reliability.md: the runs of
test_memory_pressure_engine.py, the same with tencache's out-of-memory check taken out, and stock DeepSpeed under
the same kind of squeeze, each in a memory cgroup of its own (needs root and a writable cgroup memory controller).
Prints each run's exit status, the cgroup's OOM kills, tencache's pressure messages, the working set after every
step and the host cache in use. Not a test: a measurement.

    python tests/deepspeed/measure_memory_pressure.py [auto] [short] [nocheck] [stock]

Run as ``--squeeze MODE -- <memory_squeeze.py arguments>`` it is the squeezing script itself, with MODE
``nocheck`` (the check patched out) or ``unreclaimable:BYTES`` (limit = usage without page cache + BYTES: stock
has no governor to read a step's rise from)."""
import json
import os
import socket
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MiB = 1 << 20
SUB_GROUPS = ["--steps", "5", "--sub-group-size", "2e6", "--reduce-bucket-size", "1e6"]


def as_squeeze_script(mode, argv):
    sys.path.insert(0, HERE)
    import memory_squeeze as squeeze_script
    if mode == "nocheck":
        from tencache_ds.plan.memory_pressure import MemoryPressurePolicy
        MemoryPressurePolicy.exhausted = lambda self, *args, **kwargs: None
    else:
        from tencache_ds.probes.host_memory import cgroup_usage
        from tencache_ds.units import parse_bytes
        headroom = parse_bytes(mode.split(":", 1)[1])

        def squeeze(engine, step, how):
            working_set, unreclaimable = cgroup_usage(*squeeze_script.own_cgroup())
            limit = squeeze_script.set_limit(unreclaimable + headroom)
            squeeze_script.SQUEEZES.append({"after_step": step, "working_set_bytes": working_set,
                                            "unreclaimable_bytes": unreclaimable, "limit_bytes": limit})
            squeeze_script.train.log0(f"squeezed after step {step}: limit {limit} = without page cache "
                                      f"{unreclaimable} + {headroom}")
        squeeze_script.squeeze = squeeze
    return squeeze_script.main(argv)


def new_cgroup():
    from tencache_ds.probes.host_memory import memory_cgroup_folder
    folder, _root, version = memory_cgroup_folder()
    path = os.path.join(folder, f"tencache-measure-{uuid.uuid4().hex[:6]}")
    os.mkdir(path)
    with open(os.path.join(path, "memory.limit_in_bytes" if version == 1 else "memory.max"), "w") as handle:
        handle.write("-1" if version == 1 else "max")
    return path


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(name, block, train_args, launcher=False, squeeze_mode=None, workdir="/tmp"):
    cgroup, nvme = new_cgroup(), os.path.join(workdir, f"tencache-measure-nvme-{name}")
    result = os.path.join(workdir, f"tencache-measure-{name}.json")
    args = ["--deepspeed_config", os.path.join(REPO, "configs", "stock-nvme.json"), "--nvme-path", nvme,
            "--tencache-block", block, "--result-file", result, "--model", "gpt2-tiny", "--dtype", "fp32",
            "--weights-gather", "grouped"] + train_args
    if squeeze_mode is None:
        script = [os.path.join(HERE, "memory_squeeze.py")]
    else:
        script = [os.path.abspath(__file__), "--squeeze", squeeze_mode, "--"]
    if launcher:
        command = ["deepspeed", "--num_gpus", "1", "--master_port", str(free_port())] + script + args
    else:
        command = [sys.executable] + script + args
    command = ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "sh"] + command
    env = dict(os.environ, PYTHONPATH=REPO, MALLOC_MMAP_THRESHOLD_="65536")  # as the test (why: there)
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    subprocess.run(["rm", "-rf", nvme])
    oom_kills = [line for line in open(os.path.join(cgroup, "memory.oom_control" if os.path.exists(
        os.path.join(cgroup, "memory.oom_control")) else "memory.events")) if line.startswith("oom_kill")]
    print(f"== {name}: exit {proc.returncode}; {' '.join(oom_kills).strip()}")
    for line in (proc.stdout + proc.stderr).splitlines():
        if any(key in line for key in ("squeezed", "released", "host memory", "TencacheOutOfMemory:", "loss")):
            print("  ", line[:400])
    if os.path.exists(result):
        with open(result) as handle:
            data = json.load(handle)
        os.remove(result)
        print("   working set after each step (MiB):", [round(value / MiB) for value in data["working_set_bytes"]])
        print("   host cache in use after each step (MiB):",
              [round(step["stats"].get("host_cache_bytes_in_use", 0) / MiB) for step in data["steps"]])
    for _attempt in range(50):
        try:
            os.rmdir(cgroup)
            break
        except OSError:
            time.sleep(0.2)


def main(which):
    which = which or ["auto", "short", "nocheck", "stock"]
    short = ["--steps", "4", "--squeeze-after", "2", "--squeeze-to", "short"]
    if "auto" in which:
        run("auto", "{}", SUB_GROUPS + ["--squeeze-after", "2", "--squeeze-to", "window", "--release-after", "3"],
            launcher=True)
    if "short" in which:
        run("short", '{"host_cache_bytes": 0}', short)
    if "nocheck" in which:
        run("nocheck", '{"host_cache_bytes": 0}', short, squeeze_mode="nocheck")
    if "stock" in which:
        run("stock", "none", ["--steps", "4", "--squeeze-after", "2", "--squeeze-to", "unused"],
            squeeze_mode="unreclaimable:45MiB")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--squeeze":
        sys.exit(as_squeeze_script(sys.argv[2], sys.argv[4:]))
    sys.path.insert(0, REPO)
    main(sys.argv[1:])
