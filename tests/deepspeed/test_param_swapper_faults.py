"""The parameter swapper after a failed read (real swapper, real files, DeepSpeed's CPU accelerator)."""
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.deepspeed
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_failed_read_is_reported_once_and_the_partition_can_be_read_again():
    """Defect: the partition stayed INFLIGHT after its read failed, so the next synchronize_reads said "no read in
    flight" instead of the I/O error, and the partition could never be read again."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "failed_read.py"), str(port)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout[-2000:] + proc.stderr[-4000:]
