"""`--machine this`'s collectives probe (cli/calibrate.py, ``measure_collectives``): two processes of this machine in
a gloo group, as `deepspeed --num_gpus 2` starts them on the CPU accelerator. The whole calibration runs in
tests/cli/test_estimate.py (slow); this part alone takes a few seconds."""
from tencache_ds.cli.calibrate import measure_collectives


def test_two_processes_time_stage3s_all_gather_and_reduce_scatter():
    measured = measure_collectives("fp32", nbytes=4 << 20)
    assert measured["allgather_bytes_per_s"] > 0 and measured["reduce_scatter_bytes_per_s"] > 0
    # the rate is the bytes a rank receives: half the tensor at 2 ranks, over the slowest rank's time
    assert measured["allgather_bytes_per_s"] == (2 << 20) / measured["allgather_s"]
    assert "2 processes, gloo" in measured["method"] and "4 MiB fp32" in measured["method"]
