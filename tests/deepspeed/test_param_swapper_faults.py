"""The parameter swapper on its own (real swapper, real files, DeepSpeed's CPU accelerator): after a failed read,
and its partition records; and the optimizer swapper after an update that failed on a missing file or on a write
refused as it started, and a save after one that stopped with a master lent from the partitions its file is
behind; and its fast_init stopped by a missing partition file."""
import contextlib
import os
import subprocess

import pytest

from conftest import result_of, run_helper

pytestmark = pytest.mark.deepspeed


def test_a_failed_read_is_reported_once_and_the_partition_can_be_read_again():
    """Defect: the partition stayed INFLIGHT after its read failed, so the next synchronize_reads said "no read in
    flight" instead of the I/O error, and the partition could never be read again. The same after a wait for its
    read interrupted (Ctrl-C): the read, ended but unapplied, left it "already lent or being read" (helper-140's
    review; checked: fails without the fix)."""
    run_scenario("failed_read.py")


def test_a_resident_partition_rewritten_in_place_outside_a_step_keeps_its_new_bytes():
    """Defect: stage 3's in-place copy of new weights into a resident partition was marked only at a step's end; a
    load's rebuild ends none, and the partition released before one was dropped clean (rewritten_in_place.py)."""
    run_scenario("rewritten_in_place.py")


def test_reads_ahead_due_at_positions_a_gather_bucket_passed_are_started():
    """One swap-in records a whole gather bucket's accesses: the reads the schedule issues at the positions passed
    are started too, not only those of the position reached (schedule_positions.py; helper-162's review)."""
    run_scenario("schedule_positions.py")


def test_the_partition_records_agree_with_deepspeed_after_every_call():
    """One record per partition (integrations/deepspeed/partition_record.py): asked for, read ahead, waited for,
    released, rewritten and handed over, and a read ahead that failed, each checked against DeepSpeed's status
    (tests/deepspeed/partition_records.py narrates the steps)."""
    run_scenario("partition_records.py")


def test_an_update_that_stops_on_a_missing_file_reports_that_file_after_destroy():
    """Defect: the failed update left its sub-group lent, and ``engine.destroy()`` then raised "cannot forget tensor
    ...: it is lent" over the missing file's StaleFileError."""
    run_scenario("optimizer_missing_file.py")


def test_a_close_whose_master_settle_fails_closes_then_raises():
    """A settle of an optimizer's owed masters that raises (a master file stale for good) used to stop the parameter
    swapper's close before anything was closed: its I/O threads, files and folder lock stayed."""
    run_scenario("close_after_stale_master.py")


def test_a_fast_init_stopped_by_a_missing_partition_file_leaves_no_master_lent():
    """Defect: ``initialize_from_swapped_fp16_params`` left the master it was filling lent when a parameter
    partition's file could not be read; closing the swapper then stopped on "lent and changed" over the file's
    error (checked: fails without the fix)."""
    run_scenario("fast_init_failed_read.py")


def test_a_give_back_refused_as_its_writes_start_leaves_nothing_lent_and_destroy_closes(tmp_path):
    """Defect: a sub-group's give-back stopped at the first tensor whose write was refused as it started (its swap
    file linked into a checkpoint, and no room for a file of its own): the tensors after it stayed lent, recorded
    nowhere, and ``engine.destroy()`` stopped on "cannot forget tensor ...: it is lent"."""
    try:
        proc = run_helper(os.path.join(os.path.dirname(__file__), "optimizer_refused_write.py"), ["0", tmp_path],
                          timeout=300)
    finally:  # a helper killed while its folder was immutable would leave a folder nothing can remove
        with contextlib.suppress(OSError):
            subprocess.run(["chattr", "-R", "-i", str(tmp_path)], capture_output=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    if proc.stdout.strip().endswith("SKIP: chattr +i is refused here"):
        pytest.skip("chattr +i is refused on this file system")
    assert proc.stdout.strip().endswith("OK"), proc.stdout[-2000:]


def test_an_interrupt_while_a_sub_group_goes_back_leaves_none_of_its_tensors_lent(tmp_path):
    """Regression test (helper-193): Ctrl-C (or a SystemExit) landing right after the first of a sub-group's tensors
    went back to the optimizer store skipped the others, lent for good and recorded nowhere: ``engine.destroy()``
    stopped on the lent gradient. The rest go back too now, and the interrupt is raised after."""
    proc = run_helper(os.path.join(os.path.dirname(__file__), "interrupted_give_back.py"), [tmp_path / "nvme"])
    assert result_of(proc.stdout) == {"interrupted": True, "destroy_error": None}, \
        proc.stdout[-2000:] + proc.stderr[-4000:]


def test_an_interrupt_in_a_first_steps_give_back_still_stores_the_new_moments(tmp_path):
    """Regression test (helper-209): in a sub-group's first step Adam's moments are new, stored after the lent
    tensors went back; a give-back that raised skipped that, and the moments stayed registered with no entry and no
    file: the next step's swap-in stopped on the missing file (or read an earlier run's). They are stored, then the
    give-back's error raised."""
    proc = run_helper(os.path.join(os.path.dirname(__file__), "interrupted_give_back.py"),
                      [tmp_path / "nvme", "first"])
    assert result_of(proc.stdout) == {"interrupted": True, "next_step_error": None, "destroy_error": None}, \
        proc.stdout[-2000:] + proc.stderr[-4000:]


def test_a_save_after_an_update_stopped_with_a_master_lent_from_its_partitions_is_refused_with_why():
    """integrations/deepspeed/masters_in_partitions.py check_none_lent_behind: the master's file is behind the
    partitions it was filled from, and a save would link it stale (checked: without the check the save goes on)."""
    run_scenario("owed_master_update_stopped.py")


def test_a_save_after_an_update_stopped_by_the_next_read_ahead_with_a_master_lent_is_refused_with_why():
    """The same, the update stopped by an error from the read ahead of the next sub-group, which the swap-in starts
    after lending its master from the partitions. Defect (helper-138's review): that call was outside what records
    the sub-group as lent, so the master's debt was recorded nowhere and the save linked its stale file (checked:
    fails without the fix)."""
    run_scenario("owed_master_update_stopped.py", "read-ahead")


def run_scenario(script, *args):
    """Runs a scenario script beside this file (one process: its store on port 0, which the kernel chooses as it binds
    it); it prints OK or raises."""
    proc = run_helper(os.path.join(os.path.dirname(__file__), script), ["0", *args], timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout[-2000:] + proc.stderr[-4000:]
