"""The profile file: saved and loaded by fingerprint, stale or corrupt ones reported and never used."""
import json
import logging

from tencache_ds.profile.recorder import StepRecorder
from tencache_ds.profile.store import fingerprint, load_section, save_section


def test_round_trip_and_sections_are_independent(tmp_path):
    path = str(tmp_path / "p.json")
    save_section(path, "params", fingerprint([(1, 10)], "bf16"), [1, 2, 1])
    save_section(path, "optimizer", fingerprint(["g"]), ["x", "y"])
    assert load_section(path, "params", fingerprint([(1, 10)], "bf16")) == [1, 2, 1]
    assert load_section(path, "optimizer", fingerprint(["g"])) == ["x", "y"]
    assert load_section(str(tmp_path / "absent.json"), "params", "f") is None


def test_stale_profile_is_reported_and_not_used(tmp_path):
    path = str(tmp_path / "p.json")
    save_section(path, "params", fingerprint([(1, 10)], "bf16"), [1])
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("tencache_ds")
    logger.addHandler(handler)
    try:
        assert load_section(path, "params", fingerprint([(1, 12)], "bf16")) is None  # the model changed
    finally:
        logger.removeHandler(handler)
    assert any("stale" in message and path in message for message in messages)


def test_corrupt_profile_is_not_used(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    assert load_section(str(path), "params", "f") is None
    save_section(str(path), "params", "f", [3])  # and replacing it works
    assert json.loads(path.read_text())["sections"]["params"]["order"] == [3]


def test_recorder_cuts_steps():
    recorder = StepRecorder()
    assert recorder.end_step() is None
    for key in "abc":
        recorder.touch(key)
    assert recorder.position == 3
    assert recorder.end_step() == ["a", "b", "c"] and recorder.position == 0


def test_recorder_gives_up_on_endless_steps(monkeypatch):
    from tencache_ds.profile import recorder as recorder_module
    monkeypatch.setattr(recorder_module, "MAX_STEP_ACCESSES", 3)
    recorder = StepRecorder()
    for key in range(5):
        recorder.touch(key)
    assert recorder.position == 5 and recorder.end_step() is None
