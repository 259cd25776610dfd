"""Where a training step's time goes: runs scripts/train.py in this process, its training steps under cProfile,
and prints the time spent (cumulative, and per step) in each phase DeepSpeed's ZeRO-3 step is made of. Used for the
"where the time went" tables in docs/benchmarks.md; a diagnostic, not a benchmark (cProfile slows Python code).

    python scripts/profile_phases.py [train.py arguments...]     # e.g. --deepspeed_config configs/stock-nvme.json

With PROFILE_PHASES_DUMP=FILE set, the whole profile is also saved there (pstats format, readable on another
machine: `python -m pstats FILE`), for a run on a lent GPU machine whose time is too short to read it there.
On Python 3.12 and later cProfile sees every thread's calls (it is built on sys.monitoring) and charges the I/O
threads' idle waits to the training thread's frames: there, use py-spy (docs/gpu_check.md).
"""
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402

# phase -> (file suffix, function name) whose cumulative time is the phase's time
PHASES = {
    "parameter fetch (gather + swap-in)": ("partitioned_param_coordinator.py", "fetch_sub_module"),
    "parameter release": ("partitioned_param_coordinator.py", "release_sub_module"),
    "optimizer step (whole)": ("stage3.py", "step"),
    "  optimizer state swap-in": ("stage3.py", "_optimizer_states_and_gradient_swap_in"),
    "  optimizer state swap-out": ("stage3.py", "_optimizer_states_and_gradient_swap_out"),
    "  fp16 partitions swap-out": ("stage3.py", "_partitioned_params_swap_out"),
    "  CPU Adam": ("cpu_adam.py", "step"),
    "gradient partition + offload": ("stage3.py", "partition_grads"),
    "  gradient swap-out to NVMe": ("stage3.py", "_swap_out_offload_fp32_gradients"),
    "backward (engine.backward)": ("engine.py", "backward"),
    "forward (engine.forward)": ("engine.py", "forward"),
}


def main(argv):
    profiler = cProfile.Profile()
    run_steps = train.run_steps

    def profiled_run_steps(*args, **kwargs):  # the training steps only: not start-up, not the weights' gather
        profiler.enable()
        try:
            return run_steps(*args, **kwargs)
        finally:
            profiler.disable()

    train.run_steps = profiled_run_steps
    train.main(argv)
    stats = pstats.Stats(profiler)
    if os.environ.get("PROFILE_PHASES_DUMP"):
        stats.dump_stats(os.environ["PROFILE_PHASES_DUMP"])
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 6
    print(f"\nphase: cumulative seconds over {steps} steps (cProfile), seconds per step")
    for phase, (suffix, name) in PHASES.items():
        total = sum(entry[3] for (filename, _line, function), entry in stats.stats.items()
                    if function == name and filename.endswith(suffix))
        print(f"{phase:40s} {total:8.2f} {total / steps:8.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
