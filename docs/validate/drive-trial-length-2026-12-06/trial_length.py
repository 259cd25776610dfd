"""The drive's rates into arena slots (64 MiB requests, 2 in flight, as `--machine this` times them) from trials of
the calibration's length (1 GiB, each mode three times: the calibration takes the fastest) and from long ones
(16 GiB per trial, the bytes of a gpt2-1.3b streaming step), in turn. Run from the repository root:
    python docs/validate/drive-trial-length-2026-12-06/trial_length.py /tmp/drive-trials
"""
import statistics
import sys
import time

from tencache_ds.io.drive_rate import BOTH, READ, WRITE, measure_drive

folder = sys.argv[1]
for label, trial_bytes, deadline_s, repeats in (("calibration's", 1 << 30, 1.0, 3), ("long", 16 << 30, 30.0, 1),
                                                  ("calibration's", 1 << 30, 1.0, 3), ("long", 16 << 30, 30.0, 1)):
    started = time.time()
    rate = measure_drive(folder, request_sizes=(64 << 20,), thread_counts=(2,), trial_bytes=trial_bytes,
                         deadline_s=deadline_s, repeats=repeats)
    by_mode = {mode: [t for t in rate.trials if t.mode == mode] for mode in (READ, WRITE, BOTH)}
    print(f"{label} trials ({trial_bytes >> 20} MiB, deadline {deadline_s:g} s, {repeats} repeats; {time.time() - started:.0f} s):")
    for mode, trials in by_mode.items():
        rates = [t.bytes_per_s / 1e9 for t in trials]
        sizes = [(t.read_bytes + t.write_bytes) / 2**30 for t in trials]
        print(f"  {mode}: GB/s {', '.join(f'{r:.2f}' for r in rates)} (moved {', '.join(f'{s:.1f}' for s in sizes)} GiB);"
              f" fastest {max(rates):.2f}, median {statistics.median(rates):.2f}")
    sys.stdout.flush()
