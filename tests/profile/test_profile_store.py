"""The profile file: saved and loaded by fingerprint with its timings, stale, corrupt or version-1 files reported
and never used (and never a crash), the step profile's JSON form."""
import dataclasses
import json

import pytest

from tencache_ds.profile.step_profile import StepProfile
from tencache_ds.profile.steady import SteadyTimings
from tencache_ds.profile.store import (PROFILE_VERSION, fingerprint, load_section, read_sections, save_section,
                                       save_steady)

TIMED = StepProfile(keys=(1, 2, 1), nbytes=(4096, 8192, 4096), offset_s=(0.1, 0.3, 0.6),
                    read_s=(0.05, None, 0.02), stall_s=(0.0, 0.05, 0.0, 0.02), step_s=0.7)




def test_round_trip_with_timings_and_sections_are_independent(tmp_path):
    path = str(tmp_path / "p.json")
    save_section(path, "params", fingerprint([(1, 10)], "bf16"), TIMED, facts={"dtype": "bf16"})
    save_section(path, "optimizer", fingerprint(["g"]), StepProfile.untimed(["x", "y"], [1, 2]))
    assert load_section(path, "params", fingerprint([(1, 10)], "bf16")) == TIMED
    assert load_section(path, "optimizer", fingerprint(["g"])).keys == ("x", "y")
    assert load_section(str(tmp_path / "absent.json"), "params", "f") is None
    sections = read_sections(path)
    assert sections["params"].facts == {"dtype": "bf16"} and sections["params"].recorded_unix > 0
    assert json.loads(open(path).read())["version"] == PROFILE_VERSION == 2


def test_steady_timings_join_the_section_they_describe_and_no_other(tmp_path):
    path = str(tmp_path / "p.json")
    steady = SteadyTimings.of([TIMED, dataclasses.replace(TIMED, step_s=0.9), dataclasses.replace(TIMED, step_s=0.5)])
    assert (steady.steps, steady.step_s, steady.stall_s, steady.reads) == (3, 0.7, pytest.approx(0.07), 6)
    assert steady.read_bytes == 3 * 8192 and steady.read_s == pytest.approx(3 * 0.07)
    assert not save_steady(path, "params", "f", steady)  # no file yet: nothing to describe
    save_section(path, "params", "f", TIMED)
    recorded = read_sections(path)["params"]
    assert recorded.steady is None  # (as in files of an older tencache)
    assert not save_steady(path, "params", "g", steady)  # another run's section: left alone
    assert not save_steady(path, "optimizer", "f", steady)
    assert save_steady(path, "params", "f", steady)
    saved = read_sections(path)["params"]
    assert saved.steady == steady and saved.step == TIMED and saved.recorded_unix == recorded.recorded_unix
    shorter = SteadyTimings.of([TIMED])  # an earlier run's longer summary of the same sequence stays
    assert not save_steady(path, "params", "f", shorter) and read_sections(path)["params"].steady == steady
    save_section(path, "params", "f", TIMED)  # a new profile: its repeats are not the old one's
    assert read_sections(path)["params"].steady is None
    assert save_steady(path, "params", "f", shorter)


@pytest.mark.parametrize("steady", [{"steps": 0, "step_s": 1, "compute_s": 1, "stall_s": 0, "read_bytes": 0,
                                     "read_s": 0, "reads": 0},
                                    {"steps": 1, "step_s": float("nan"), "compute_s": 1, "stall_s": 0,
                                     "read_bytes": 0, "read_s": 0, "reads": 0}, {"steps": 2}, "fast"])
def test_malformed_steady_timings_are_ignored_with_a_warning_and_the_profile_still_serves(tmp_path, messages,
                                                                                         steady):
    """They only price steps; the access order beside them is what eviction needs."""
    path = tmp_path / "p.json"
    save_section(str(path), "params", "f", TIMED)
    data = json.loads(path.read_text())
    data["sections"]["params"]["steady"] = steady
    path.write_text(json.dumps(data))
    assert read_sections(str(path))["params"].steady is None
    assert any("steady timings are unusable" in message and str(path) in message for message in messages)
    assert load_section(str(path), "params", "f") == TIMED


def test_stale_profile_is_reported_and_not_used(tmp_path, messages):
    path = str(tmp_path / "p.json")
    save_section(path, "params", fingerprint([(1, 10)], "bf16"), TIMED)
    assert load_section(path, "params", fingerprint([(1, 12)], "bf16")) is None  # the model changed
    assert any("stale" in message and path in message for message in messages)


def test_version_1_file_is_reported_not_used_and_replaced(tmp_path, messages):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"version": 1, "sections": {"params": {"fingerprint": "f", "order": [1, 2]}}}))
    assert load_section(str(path), "params", "f") is None
    assert any("version 1" in message and "re-profiling" in message for message in messages)
    save_section(str(path), "params", "f", TIMED)
    assert load_section(str(path), "params", "f") == TIMED


@pytest.mark.parametrize("content", [
    "{not json",
    "[1, 2]",
    json.dumps({"version": 2, "sections": []}),
    json.dumps({"version": 2, "sections": {"params": {"fingerprint": "f"}}}),  # no step
    json.dumps({"version": 2, "sections": {"params": {"fingerprint": "f", "step": {
        "keys": [1, 2], "nbytes": [1], "offset_s": [0, 0], "read_s": [None, None], "stall_s": [0, 0, 0],
        "step_s": 0}}}}),  # columns of different lengths
    # numbers no clock or size gives: JSON reads 1e400 as infinity (int() of it raised OverflowError, which stopped
    # the run at start-up), and a NaN or negative time would plan reads and price steps
    '{"version": 2, "sections": {"params": {"fingerprint": "f", "step": {"keys": [1], "nbytes": [1e400], '
    '"offset_s": [0], "read_s": [null], "stall_s": [0, 0], "step_s": 1}}}}',
    '{"version": 2, "sections": {"params": {"fingerprint": "f", "step": {"keys": [1], "nbytes": [8], '
    '"offset_s": [NaN], "read_s": [null], "stall_s": [0, 0], "step_s": 1}}}}',
    '{"version": 2, "sections": {"params": {"fingerprint": "f", "step": {"keys": [1], "nbytes": [8], '
    '"offset_s": [0], "read_s": [-5.0], "stall_s": [0, 0], "step_s": 1}}}}',
])
def test_corrupt_profile_is_reported_not_used_and_replaced(tmp_path, messages, content):
    path = tmp_path / "p.json"
    path.write_text(content)
    assert load_section(str(path), "params", "f") is None
    assert any("unusable" in message for message in messages)
    save_section(str(path), "params", "f", TIMED)  # and replacing it works
    assert load_section(str(path), "params", "f") == TIMED


def test_a_damaged_section_leaves_the_files_other_sections_serving(tmp_path, messages):
    """One section damaged (its steady count 1e400, and its step's sizes): the other section still loads, before
    and after a save of it (a save keeps the damaged one as it is), and the damaged one is reported."""
    path = str(tmp_path / "p.json")
    save_section(path, "params", "f", TIMED)
    save_section(path, "optimizer", "g", StepProfile.untimed(["x"], [1]))
    text = open(path).read()
    data = json.loads(text)
    data["sections"]["optimizer"]["step"]["nbytes"] = ["BIG"]
    data["sections"]["params"]["steady"] = {"steps": "HUGE"}
    open(path, "w").write(json.dumps(data).replace('["BIG"]', "[1e400]").replace('"HUGE"', "1e400"))
    assert load_section(path, "params", "f") == TIMED
    assert load_section(path, "optimizer", "g") is None
    assert any("[optimizer] is a malformed section" in message for message in messages)
    assert read_sections(path, skip_damaged=True)["params"].steady is None  # ignored: its order serves
    save_section(path, "params", "f", TIMED)
    assert load_section(path, "params", "f") == TIMED
    # read as the CLIs read it (estimate --profile, profile show): refused, naming the section
    with pytest.raises(ValueError, match=r"\[optimizer\] is a malformed section \(ValueError: an access size"):
        read_sections(path)


def test_step_profile_json_round_trip_keeps_tuple_keys_and_missing_reads():
    step = StepProfile.untimed([("0_27", "exp_avg"), 3], [8, 9])
    assert StepProfile.from_json(json.loads(json.dumps(step.to_json()))) == step


def test_step_profile_rejects_columns_of_different_lengths():
    with pytest.raises(ValueError, match="stalls"):
        StepProfile(("a",), (1,), (0.0,), (None,), (0.0,), 1.0)


def test_compute_never_goes_negative_when_clocks_disagree():
    """The stall is measured by the store around its wait, the gap by the recorder: a stall a hair longer than
    its gap must not make compute negative."""
    step = StepProfile(("a",), (1,), (0.1,), (None,), (0.0, 0.2), 0.25)
    assert step.gap_compute_s() == [0.1, 0.0]


def test_a_save_keeps_the_files_permissions_and_a_new_file_gets_the_umasks(tmp_path):
    """The temporary file a save renames over the profile was made 0600 (mkstemp): each save turned a profile that
    several users share unreadable to the others."""
    import os
    import stat
    path = tmp_path / "p.json"
    save_section(str(path), "params", "f", TIMED)
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    path.chmod(0o664)
    save_section(str(path), "params", "f", TIMED)
    assert stat.S_IMODE(path.stat().st_mode) == 0o664


@pytest.mark.parametrize("recorded", ["NaN", '"x"', "1e20", "true", "-5"])
def test_a_recording_time_no_date_can_be_made_of_is_a_malformed_section(tmp_path, recorded):
    """JSON readers take NaN; a date of 1e20 s overflows; true read as 1970: `profile show` stopped with a traceback
    (ValueError, TypeError, OverflowError in fromtimestamp) or printed a false date."""
    path = str(tmp_path / "p.json")
    save_section(path, "params", "f", TIMED)
    data = json.loads(open(path).read())
    data["sections"]["params"]["recorded_unix"] = "PLACE"
    open(path, "w").write(json.dumps(data).replace('"PLACE"', recorded))
    with pytest.raises(ValueError, match=r"\[params\] is a malformed section \(ValueError: recorded_unix must be"):
        read_sections(path)
    assert load_section(path, "params", "f") is None  # a run re-profiles it


def test_a_profile_whose_reads_moved_no_byte_has_no_bandwidth():
    """Measured reads of size 0 (a hand-edited file: recording never makes them) read as no bandwidth, not 0 B/s,
    which the prefetch planner divided by inside a swap-in (helper-180); the parameter swapper plans no schedule
    from a profile without a bandwidth."""
    from tencache_ds.profile.step_profile import StepProfile
    step = StepProfile(("a", "b"), (0, 0), (0.0, 0.1), (0.01, 0.02), (0.0, 0.0, 0.0), 0.2)
    assert step.measured_read_bytes_per_s is None


def test_a_missing_profile_whose_ranks_wrote_theirs_names_their_files(tmp_path):
    """helper-234: at several ranks each rank writes <root>.rank<r><ext> and the configured name never exists; the
    CLIs given that name said only "No such file"."""
    for rank in (10, 0, 1):
        save_section(str(tmp_path / f"p.rank{rank}.json"), "params", "f", TIMED)
    with pytest.raises(FileNotFoundError) as raised:
        read_sections(str(tmp_path / "p.json"))
    assert f"these exist: {tmp_path}/p.rank0.json, {tmp_path}/p.rank1.json, {tmp_path}/p.rank10.json" \
        in str(raised.value)
    with pytest.raises(FileNotFoundError, match=r"No such file or directory: '[^;]*'$"):
        read_sections(str(tmp_path / "q.json"))


def test_a_stale_section_names_the_facts_that_differ(tmp_path, messages):
    """helper-239: "recorded for another model or config" alone, also where an upgrade fingerprints a fact the
    profile's tencache did not note (every profile stale once)."""
    path = str(tmp_path / "p.json")
    save_section(path, "params", "old", TIMED, {"dtype": "torch.float32", "world_size": 1})
    assert load_section(path, "params", "new", {"dtype": "torch.float32", "world_size": 2,
                                                "train_micro_batch_size_per_gpu": 4}) is None
    [stale] = [message for message in messages if "is stale" in message]
    assert "; train_micro_batch_size_per_gpu not noted (an older tencache's profile), world_size 1 -> 2)" in stale
    assert "dtype" not in stale
