"""Fixtures shared across test folders."""
import os
import shutil
import subprocess
import tempfile

import pytest

from tencache_ds.io.direct_io import DirectFileIO
from tencache_ds.io.reflink import folder_clones

REFLINK_IMAGE_BYTES = 3 << 30  # sparse: a training run's swap folder and checkpoints, with room to spare


@pytest.fixture
def io():
    """A real I/O engine (two threads), closed after the test."""
    engine = DirectFileIO(num_threads=2)
    yield engine
    engine.close()


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
    work = tempfile.mkdtemp(prefix="tencache-reflink-")
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
