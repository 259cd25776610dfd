"""Paths the "tencache" block names, tried as a new user would: one that cannot be written stops scripts/train.py
with an error naming the key and the path, at zero.Init, before any swap file exists (not at the first metrics
line, after the swap files; not never, for a profile that would silently not be saved).

/proc takes no new file whatever its permission bits say, so the run fails for root too (these tests run as root)."""
import os

import pytest

pytestmark = pytest.mark.deepspeed


@pytest.mark.parametrize("key", ["metrics_path", "profile_path"])
def test_an_unwritable_output_path_stops_the_run_before_any_swap_file(train, tmp_path, key):
    nvme = tmp_path / "nvme"
    path = os.path.join("/proc", "tencache-runs", f"{key}.json")
    failed = train(block={key: path}, nvme_path=str(nvme), expect_failure=True, steps=1, weights_gather="none")
    assert f"tencache.{key} = '{path}' is not usable" in failed.output, failed.output[-3000:]
    assert "TencacheResourceError" in failed.output
    swap_files = [name for _root, _dirs, names in os.walk(nvme) for name in names]
    assert swap_files == []
