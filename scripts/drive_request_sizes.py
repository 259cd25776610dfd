"""The drive's rates by request size and by system-call size, with tencache's own engine (io/drive_rate.py
``measure_drive``: writes, overwrites, reads and both at once, 2 requests in flight), each combination timed twice,
interleaved. It showed that on this VM's virtual disk the request size moves the rate and the engine's system-call
size (io/direct_io.py ``CHUNK_BYTES``) does not, which is why `--machine this` times three request sizes
(machine.nvme_request_factors; docs/estimate.md, "Request size").

    python3 scripts/drive_request_sizes.py /tmp/drive-sizes [--requests-mib 4 64 400] [--chunks-mib 16]
"""
import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tencache_ds.io import direct_io  # noqa: E402
from tencache_ds.io.drive_rate import measure_drive  # noqa: E402

MIB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a folder on the drive to measure (created, then removed)")
    parser.add_argument("--requests-mib", type=int, nargs="+", default=[4, 64, 400])
    parser.add_argument("--chunks-mib", type=int, nargs="+", default=[direct_io.CHUNK_BYTES // MIB])
    parser.add_argument("--trial-mib", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.makedirs(args.folder, exist_ok=True)
    try:
        for _round in range(args.rounds):
            for chunk in args.chunks_mib:
                direct_io.CHUNK_BYTES = chunk * MIB
                for request in args.requests_mib:
                    rate = measure_drive(args.folder, request_sizes=(request * MIB,), thread_counts=(2,),
                                         trial_bytes=args.trial_mib * MIB, deadline_s=10.0)
                    print(f"system calls of {chunk} MiB, requests of {request} MiB: read "
                          f"{rate.read_bytes_per_s / 1e9:.2f}, write {rate.write_bytes_per_s / 1e9:.2f}, both at once "
                          f"{(rate.both_read_bytes_per_s + rate.both_write_bytes_per_s) / 1e9:.2f} GB/s", flush=True)
    finally:
        shutil.rmtree(args.folder, ignore_errors=True)


if __name__ == "__main__":
    main()
