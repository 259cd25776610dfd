"""Fixtures shared across test folders, and the suite's one thread of compute per process."""
import glob
import os
import shutil
import subprocess
import tempfile

# One OpenMP thread in every process the suite starts (set before torch is imported here; inherited by the
# training runs, the fork server and the ranks of each launch): with two, runs forked from the fork server computed
# other last bits now and then, and parity tests failed at random (docs/reliability.md, "The suite on an Intel
# Xeon"). Both arms of each comparison run with it. OMP_NUM_THREADS exported by the developer is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from tencache_ds.io.direct_io import DirectFileIO  # noqa: E402
from tencache_ds.io.reflink import folder_clones  # noqa: E402

REFLINK_IMAGE_BYTES = 3 << 30  # sparse: a training run's swap folder and checkpoints, with room to spare


@pytest.fixture
def io():
    """A real I/O engine (two threads), closed after the test."""
    engine = DirectFileIO(num_threads=2)
    yield engine
    engine.close()


@pytest.fixture
def small_tmpfs(tmp_path):
    """``small_tmpfs(size)``: a folder under tmp_path with a tmpfs of ``size`` ("1m") mounted on it, unmounted after
    the test (a full disk, real); the test is skipped where none can be mounted (needs root)."""
    mounted = []

    def mount(size: str):
        folder = tmp_path / f"small-disk-{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}): needs root")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _sweep_reflink_images_of_dead_processes():
    """A session killed (a CI timeout, SIGKILL) skips the fixture's teardown: its XFS image stayed mounted under
    /tmp, 3 GiB of sparse file a later run could run short of disk over. Those of processes gone are unmounted and
    removed (the folder's name carries its creator's pid)."""
    for work in glob.glob(os.path.join(tempfile.gettempdir(), "tencache-reflink-*")):
        parts = os.path.basename(work).split("-")
        if len(parts) < 4 or not parts[2].isdigit():
            continue
        try:
            os.kill(int(parts[2]), 0)
            continue  # alive: another session's
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        mount_point = os.path.join(work, "mnt")
        if os.path.ismount(mount_point):
            subprocess.run(["umount", "-l", mount_point], capture_output=True)
        if not os.path.ismount(mount_point):
            shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def reflink_folder():
    """A folder on a file system that clones ranges (io/reflink.py): $TENCACHE_TEST_REFLINK_DIR where set, else a
    sparse XFS image mounted on a loop device for the session (root and mkfs.xfs, which scripts/setup.sh installs),
    else the test is skipped with the reason."""
    given = os.environ.get("TENCACHE_TEST_REFLINK_DIR")
    if given:
        if not folder_clones(given):
            pytest.fail(f"TENCACHE_TEST_REFLINK_DIR={given}: its file system does not clone ranges")
        folder = tempfile.mkdtemp(dir=given, prefix="tencache-test-")
        yield folder
        shutil.rmtree(folder, ignore_errors=True)
        return
    if os.geteuid() != 0 or shutil.which("mkfs.xfs") is None:
        pytest.skip("no file system that clones ranges: set TENCACHE_TEST_REFLINK_DIR, or run as root with mkfs.xfs")
    _sweep_reflink_images_of_dead_processes()
    work = tempfile.mkdtemp(prefix=f"tencache-reflink-{os.getpid()}-")
    image, mount_point = os.path.join(work, "xfs.img"), os.path.join(work, "mnt")
    os.makedirs(mount_point)
    with open(image, "wb") as handle:
        handle.truncate(REFLINK_IMAGE_BYTES)
    made = subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", image], capture_output=True, text=True)
    mounted = made.returncode == 0 and subprocess.run(["mount", "-o", "loop", image, mount_point],
                                                      capture_output=True, text=True)
    if not mounted or mounted.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        why = (made.stderr if made.returncode else mounted.stderr).strip()
        pytest.skip(f"could not mount an XFS image on a loop device: {why}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", mount_point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mount_point], capture_output=True)  # busy: detach it now, free it later
        if not os.path.ismount(mount_point):  # never remove files through a file system still mounted
            shutil.rmtree(work, ignore_errors=True)


# The tests that take longest (about a minute or more each on 2 cores: two-rank launches of many scenarios, the
# machine's calibration), longest first. pytest-xdist's worksteal gives each of the two workers half of the
# collection in order, then moves tests from the end of one's queue to the other when it runs dry: a long test
# collected late ran alone at the end while the other worker idled (the last 5% of a full run took 8 of its 26
# minutes). So these start first, alternately at the head of each worker's half.
LONGEST_FIRST = (  # by a full run's --durations on 2026-12-01 (the 2-core AMD VM)
    "tests/deepspeed/test_zero_scenarios.py::",
    "tests/cli/test_estimate.py::test_machine_this_measures",
    "tests/deepspeed/test_upstream_checkpoints.py::",
    "tests/deepspeed/test_hf_trainer.py::",
    "tests/cli/test_cli.py::test_bench_end_to_end",
    "tests/deepspeed/test_memory_pressure_engine.py::test_auto_fills_the_memory_a_small_container_leaves_free",
    "tests/deepspeed/test_rank_agreement.py::test_ranks_with_different_budgets",
    "tests/deepspeed/test_tensor_fragments.py::",
    "tests/deepspeed/test_zero_to_fp32.py::test_zero_to_fp32_of_a_tencache_checkpoint",
    "tests/deepspeed/test_parity.py::test_bit_identical_through_the_deepspeed_launcher",
    "tests/test_step_phases.py::test_phases_under_the_launcher",
    "tests/deepspeed/test_parity.py::test_bit_identical_with_bf16_masters_and_optimizer_state",
    "tests/deepspeed/test_forkserver.py::test_forked_ranks_compute_with_the_suites_one_thread",
    "tests/deepspeed/test_output_paths.py::test_a_second_run_in_a_swap_folder_in_use",
)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(items):
    def rank(item):
        return next((index for index, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)),
                    len(LONGEST_FIRST))

    longest = sorted((item for item in items if rank(item) < len(LONGEST_FIRST)), key=rank)
    rest = [item for item in items if rank(item) == len(LONGEST_FIRST)]
    first_half = longest[0::2]
    split = max(0, len(items) // 2 - len(first_half))
    items[:] = first_half + rest[:split] + longest[1::2] + rest[split:]
