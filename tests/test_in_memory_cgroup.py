"""scripts/in_memory_cgroup.py, which shows what a run that needs more memory than the machine does: a command over
its limit is ended by the OOM killer inside its own cgroup (nothing else on the machine), and the verdict says so;
one within its limit runs as usual."""
import os
import subprocess
import sys

import pytest

from tencache_ds.probes.host_memory import memory_cgroup_folder

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "in_memory_cgroup.py")


@pytest.fixture(autouse=True)
def needs_a_memory_cgroup():
    folder, _root, _version = memory_cgroup_folder()
    if folder is None or not os.access(folder, os.W_OK):
        pytest.skip("needs a writable memory cgroup (root, cgroup file system with the memory controller)")


def run(limit, code):
    return subprocess.run([sys.executable, SCRIPT, "--limit", limit, "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120)


def test_a_command_over_its_limit_is_killed_inside_its_cgroup_and_the_verdict_says_so():
    over = run("200MB", "x = bytearray(400 * 1024 * 1024); print('survived')")
    assert over.returncode == 137 and "survived" not in over.stdout
    assert "killed by signal 9; OOM kills in its cgroup: 1" in over.stdout


def test_a_command_within_its_limit_runs_and_keeps_its_exit_code():
    within = run("200MB", "import sys; print('fine'); sys.exit(3)")
    assert within.returncode == 3 and "fine" in within.stdout and "exited with 3; OOM kills in its cgroup: 0" in within.stdout
