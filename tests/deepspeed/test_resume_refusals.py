"""Checkpoints a resuming engine cannot take whole are refused before anything is placed, with an error naming the
setting that changed (the upstream scenarios with another world size and other sub-groups:
test_upstream_checkpoints.py); and a save that cannot hold a whole step is refused before anything is written."""
import os

import pytest

from conftest import result_of, run_helper

pytestmark = pytest.mark.deepspeed
SCRIPT = os.path.join(os.path.dirname(__file__), "swap_threshold_resume.py")
MIB = 2**20


def resume(tmp_path, save_block, load_block):
    for block, action in ((save_block, "save"), (load_block, "load")):
        proc = run_helper(SCRIPT, [tmp_path / f"nvme-{action}", tmp_path / "checkpoint", str(block), action])
        result = result_of(proc.stdout)
        assert result is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    return result


def test_a_sub_group_swapped_at_the_save_and_kept_in_memory_at_the_load_is_refused(tmp_path):
    """Saved with ``aio.block_size`` 1 MiB (both sub-groups swapped), loaded with 4 MiB (the 2 MiB one kept in
    memory): refused, naming the block size. Until 2026-12-07 the load went on, the kept sub-group's saved moments
    dropped (helper-172)."""
    error = resume(tmp_path, MIB, 4 * MIB)["error"]
    assert error is not None and error.startswith("TencacheError") and "aio.block_size" in error, error
    assert "keeps in memory" in error, error


def test_a_sub_group_kept_in_memory_at_the_save_and_swapped_at_the_load_is_refused_as_a_change_of_layout(tmp_path):
    """The reverse: saved with 4 MiB (the 2 MiB sub-group kept in memory, no master file), loaded with 1 MiB (both
    swapped): a change of layout, named so; not an incomplete checkpoint (helper-239: the check for a save cut
    short among its master files took it for one, and a good checkpoint might have been thrown away)."""
    error = resume(tmp_path, 4 * MIB, MIB)["error"]
    assert error is not None and "aio.block_size" in error and "incomplete" not in error, error


def test_the_same_block_size_resumes(tmp_path):
    assert resume(tmp_path, MIB, MIB)["error"] is None


def test_a_save_after_a_step_that_stopped_part_way_is_refused_before_anything_is_written(tmp_path):
    """The update raised after a sub-group's swap-in (Ctrl-C, an error in the step): the save names that sub-group
    and writes nothing. Until 2026-12-07 it wrote the model's files, then stopped at the lent gradient's flush
    (helper-177)."""
    proc = run_helper(os.path.join(os.path.dirname(__file__), "stopped_step_save.py"),
                      [tmp_path / "nvme", tmp_path / "checkpoint"])
    result = result_of(proc.stdout)
    assert result is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert result["error"] is not None and result["error"].startswith("TencacheError"), result
    assert "still swapped in" in result["error"] and "Nothing was written" in result["error"]
    assert result["written"] == [], result


def test_a_save_after_a_step_that_stopped_between_two_sub_groups_is_refused_until_a_step_ends(tmp_path):
    """Regression test (helper-220's review): the update stopped after the first sub-group's give-back, before the
    second's swap-in (Ctrl-C in its fill from the partitions, say: none swapped in). The save went on: a checkpoint
    of the first sub-group at the next step and the second at the last. It is refused now, and allowed again once
    a step ends."""
    proc = run_helper(os.path.join(os.path.dirname(__file__), "stopped_step_save.py"),
                      [tmp_path / "nvme", tmp_path / "checkpoint", "between"])
    result = result_of(proc.stdout)
    assert result is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert result["error"] is not None and result["error"].startswith("TencacheError"), result
    assert "stopped part way" in result["error"] and "after updating 1 of 3" in result["error"], result
    assert result["written"] == [] and result["then_saved"] is None, result


def test_a_save_into_a_tag_saved_before_stopped_part_way_is_refused_at_its_load(tmp_path):
    """Regression (helper-182's review): a second save into a tag replaced its swap files one by one after the new
    model and ZeRO files; stopped between (Ctrl-C, a full disk), the tag mixed new step counts with the earlier
    save's masters and moments, and a load took it without a word. The earlier save's swap files go first now: the
    load refuses the tag as incomplete."""
    script = os.path.join(os.path.dirname(__file__), "interrupted_resave.py")
    saved = result_of(run_helper(script, ["save", tmp_path / "nvme", tmp_path / "checkpoint"]).stdout)
    assert saved == {"stopped": True}, saved
    proc = run_helper(script, ["load", tmp_path / "nvme-load", tmp_path / "checkpoint"])
    loaded = result_of(proc.stdout)
    assert loaded is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert loaded["error"] is not None and "load_checkpoint" in loaded["error"], loaded


def test_a_checkpoint_of_other_parameter_groups_is_refused_as_stock_cpu_offload_refuses_it(tmp_path):
    """Regression (helper-190's review): sub-groups of the same sizes in other parameter groups passed the swap
    files' layout check, and the load went on with each group's settings copied by its index."""
    script = os.path.join(os.path.dirname(__file__), "regrouped_load.py")
    assert result_of(run_helper(script, ["save", tmp_path / "nvme", tmp_path / "checkpoint"]).stdout) == {"saved": True}
    proc = run_helper(script, ["load", tmp_path / "nvme-load", tmp_path / "checkpoint"])
    loaded = result_of(proc.stdout)
    assert loaded is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert loaded["error"] is not None and "parameter groups hold [2, 1] optimizer sub-groups, this engine's [1, 2]" \
        in loaded["error"], loaded


def test_a_save_dir_deepspeed_refuses_removes_nothing(tmp_path):
    """Regression test (helper-192): save_checkpoint("") removed this rank's swap files of a tag under the working
    folder before DeepSpeed's own refusal, and save_checkpoint(None) stopped in os.path.join instead of on it."""
    (tmp_path / "checkpoint").mkdir()
    proc = run_helper(os.path.join(os.path.dirname(__file__), "interrupted_resave.py"),
                      ["no_save_dir", tmp_path / "nvme", tmp_path / "checkpoint"])
    result = result_of(proc.stdout)
    assert result is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert result["kept"], result
    assert all(error is not None and error.startswith("ValueError: save_dir must be a non-empty string")
               for error in result["errors"]), result


def test_a_new_state_whose_first_store_failed_is_never_read_from_a_file_it_did_not_write(tmp_path):
    """Regression test (helper-220's review): the first step's store of Adam's first moment failed; the second
    moment was not stored (its file never written either) and both stayed registered. The next swap-in read their
    files: missing, or, in a reused folder, an earlier run's, without a word. Now the other is stored, and the lost
    one stops the next step and the save with an error naming it."""
    proc = run_helper(os.path.join(os.path.dirname(__file__), "lost_new_state.py"),
                      [tmp_path / "nvme", tmp_path / "checkpoint"])
    result = result_of(proc.stdout)
    assert result is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "No space left on device (the test's refusal)" in result["first"], result
    assert [name.split("-")[0] for name in result["stored"]] == ["exp_avg_sq"], result
    for key in ("next", "save"):
        assert result[key] is not None and result[key].startswith("TencacheError") and "was lost" in result[key], \
            result


@pytest.mark.parametrize("checkpoint", ["good", "empty"])
def test_the_checkpoint_a_lost_state_asks_for_loads_and_trains(tmp_path, checkpoint):
    """Regression test (helper-228's, helper-232's reviews): after a new state's first store failed, the load its
    error asks for stopped in its own rebuild of the parameters (a swap-in, refused for the lost state the load was
    replacing), and where the checkpoint holds no state (saved before any step) read the file never written. The
    sub-group starts over as a fresh engine's: the checkpoint's state, or none (Adam starts over, as stock's)."""
    script = os.path.join(os.path.dirname(__file__), "lost_new_state.py")
    if checkpoint == "good":
        saved = result_of(run_helper(script, [tmp_path / "nvme-good", tmp_path / "checkpoint", "save-good"]).stdout)
        assert saved == {"saved": True}, saved
    proc = run_helper(script, [tmp_path / "nvme", tmp_path / "checkpoint", f"load-{checkpoint}"])
    result = result_of(proc.stdout)
    assert result is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "was lost" in result["next"], result
    assert result["load"] is None and result["after_load"] is None, result
