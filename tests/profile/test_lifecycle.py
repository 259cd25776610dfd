"""The profile lifecycle: warm-up, recording the first training step, predicting, divergence (demand fetching for
the rest of the step), and replacement of the profile only when a new sequence repeats. Real files, real
recorder; each scenario narrates its steps."""
import json

import pytest

from tencache_ds.profile.lifecycle import LEGAL_TRANSITIONS, Phase, ProfileLifecycle
from tencache_ds.profile.recorder import StepRecorder
from tencache_ds.profile.steady import STEADY_STEPS
from tencache_ds.profile.store import load_section, read_sections

TENSORS = [("a", 10), ("b", 20), ("c", 30)]
TRAIN = "abccba"        # forward a b c, backward c b a
EVAL_THEN_TRAIN = "abcabccba"  # an eval forward before the training step
GA2 = "abccbaabccba"    # two micro steps per optimizer step


def new(path=None, first_training_step=1, **kwargs):
    return ProfileLifecycle(StepRecorder(), path, "params", first_training_step=first_training_step, **kwargs)


def run_step(lifecycle, keys, check=None):
    """Touch ``keys`` in order (calling ``check`` after each), then end the step; returns the next index."""
    for key in keys:
        lifecycle.recorder.touch(key, 4096)
        if check is not None:
            check(key)
    return lifecycle.end_step()




def test_transition_table_is_the_documented_machine():
    assert LEGAL_TRANSITIONS == {
        Phase.WARMUP: {Phase.WARMUP, Phase.RECORDING, Phase.PREDICTING},
        Phase.RECORDING: {Phase.RECORDING, Phase.PREDICTING},
        Phase.PREDICTING: {Phase.PREDICTING, Phase.DIVERGED},
        Phase.DIVERGED: {Phase.PREDICTING},
    }


def test_an_illegal_transition_is_refused():
    lifecycle = new()
    with pytest.raises(AssertionError):
        lifecycle._move(Phase.DIVERGED)  # WARMUP -> DIVERGED: there is no profile to leave


def test_first_training_step_is_recorded_saved_and_then_predicts(tmp_path):
    path = str(tmp_path / "profile.json")
    lifecycle = new(path)
    # load before any step: nothing saved yet
    assert lifecycle.load(TENSORS, dtype="bf16") is None and lifecycle.source == "none"
    # initialisation (stage 3 reads every tensor once): warm-up, not the profile
    assert run_step(lifecycle, "abc") is None and lifecycle.phase is Phase.RECORDING
    # the first training step is recorded on demand fetching, then becomes the profile
    index = run_step(lifecycle, TRAIN)
    assert lifecycle.phase is Phase.PREDICTING and lifecycle.source == "recorded"
    assert index is lifecycle.index and index.distance("a", 0) == 0 and lifecycle.generation == 1
    assert load_section(path, "params", lifecycle._fingerprint).keys == tuple(TRAIN)
    assert read_sections(path)["params"].facts == {"dtype": "bf16", "tensors": 3, "elements": 60}
    # the next step repeats it: still predicting, the recorded step as it was (only its repeats' timings added)
    before = read_sections(path)["params"].recorded_unix
    assert run_step(lifecycle, TRAIN) is index and lifecycle.divergences == 0
    assert read_sections(path)["params"].recorded_unix == before
    assert read_sections(path)["params"].step.to_json() == lifecycle.profile.to_json()


def test_the_steps_that_repeat_the_profile_are_timed_and_saved_with_it_until_a_new_one_replaces_it(tmp_path):
    """The recorded step is the run's first; the first STEADY_STEPS repeats, as medians, are how the run goes on
    (plan/profile_timings.py prices from them)."""
    path = str(tmp_path / "profile.json")
    clock = iter(range(1000))
    lifecycle = ProfileLifecycle(StepRecorder(clock=lambda: float(next(clock))), path, "params")
    lifecycle.load(TENSORS, dtype="bf16")
    run_step(lifecycle, "abc")                     # initialisation
    run_step(lifecycle, TRAIN)                     # recorded: no repeat yet
    assert lifecycle.steady is None and read_sections(path)["params"].steady is None
    for repeats in range(1, STEADY_STEPS + 2):
        run_step(lifecycle, TRAIN)
        saved = read_sections(path)["params"].steady
        assert saved == lifecycle.steady and saved.steps == min(repeats, STEADY_STEPS)
    # each access takes one tick of the fake clock and the step's end one more: 7 a step, none of it waiting
    assert (saved.step_s, saved.compute_s, saved.stall_s, saved.reads) == (7.0, 7.0, 0.0, 0)
    # a lasting change replaces the profile: its own repeats start from none
    run_step(lifecycle, "abba")
    run_step(lifecycle, "abba")
    assert lifecycle.profile.keys == tuple("abba") and lifecycle.steady is None
    assert read_sections(path)["params"].steady is None
    run_step(lifecycle, "abba")
    assert read_sections(path)["params"].steady.steps == 1


def test_a_restart_does_not_time_its_first_training_step_nor_shorten_the_summary_on_file(tmp_path):
    path = str(tmp_path / "profile.json")
    first = new(path)
    first.load(TENSORS, dtype="bf16")
    for keys in ["abc", TRAIN] + [TRAIN] * (STEADY_STEPS + 1):
        run_step(first, keys)
    assert read_sections(path)["params"].steady.steps == STEADY_STEPS
    restarted = new(path)
    restarted.load(TENSORS, dtype="bf16")
    assert restarted.source == "loaded" and restarted.steady is None
    run_step(restarted, "abc")  # initialisation
    run_step(restarted, TRAIN)  # the run's first training step repeats the loaded profile, with first-step costs
    assert restarted.steady is None
    run_step(restarted, TRAIN)
    run_step(restarted, TRAIN)
    assert restarted.steady.steps == 2 and read_sections(path)["params"].steady.steps == STEADY_STEPS


def test_a_saved_profile_is_reused_on_restart_and_serves_eviction_from_the_start(tmp_path):
    path = str(tmp_path / "profile.json")
    first = new(path)
    first.load(TENSORS, dtype="bf16")
    run_step(first, "abc")
    run_step(first, TRAIN)
    # a new process, same tensors and facts
    second = new(path)
    index = second.load(TENSORS, dtype="bf16")
    assert index is not None and second.source == "loaded" and second.phase is Phase.WARMUP
    run_step(second, "abc")  # initialisation is not checked
    assert second.phase is Phase.PREDICTING and second.divergences == 0
    run_step(second, TRAIN)
    assert second.source == "loaded" and second.divergences == 0
    # other facts (a changed gradient accumulation setting) make it stale: recorded afresh
    third = new(path)
    assert third.load(TENSORS, dtype="bf16", gradient_accumulation_steps=2) is None


def test_an_eval_pass_falls_back_to_demand_fetching_and_keeps_the_profile(tmp_path):
    """Divergence mid-step: from the first access that differs the store gets no index (LRU), and the phase says
    DIVERGED until the step ends. A one-off does not replace the profile."""
    lifecycle = new(str(tmp_path / "p.json"), first_training_step=0)
    run_step(lifecycle, TRAIN)  # recorded
    profile = lifecycle.profile
    phases = []
    run_step(lifecycle, EVAL_THEN_TRAIN, check=lambda key: phases.append(
        (lifecycle.phase, lifecycle.recorder.on_track, lifecycle.index is None)))
    # a b c match the profile's start; the eval's second "a" differs from the profile's "c" at access 3
    assert phases[:3] == [(Phase.PREDICTING, True, False)] * 3
    assert phases[3:] == [(Phase.DIVERGED, False, True)] * 6
    assert lifecycle.diverged_at == 3 and lifecycle.divergences == 1
    # the step ended: the profile predicts the next one again, and it is the same profile
    assert lifecycle.phase is Phase.PREDICTING and lifecycle.profile is profile and lifecycle.index is not None
    run_step(lifecycle, TRAIN)
    assert lifecycle.divergences == 1 and lifecycle.profile is profile


def test_a_one_off_that_recurs_between_training_steps_never_replaces_the_profile(tmp_path):
    """An eval pass (or a 16-bit save, which gathers every parameter) every few steps is the same one-off each time.
    The step that left the profile was remembered until a later one left it the same way, however many steps
    repeated the profile between: the second eval pass replaced the profile with the eval step, and the training
    steps after it left that one (two steps on demand fetching, the profile file written twice, each period)."""
    lifecycle = new(str(tmp_path / "p.json"), first_training_step=0)
    run_step(lifecycle, TRAIN)  # recorded
    profile = lifecycle.profile
    for _period in range(3):
        run_step(lifecycle, EVAL_THEN_TRAIN)
        run_step(lifecycle, TRAIN)
        run_step(lifecycle, TRAIN)
    assert lifecycle.profile is profile and lifecycle.generation == 1
    assert lifecycle.divergences == 3  # the eval steps alone


def test_a_lasting_change_replaces_the_profile_once_it_repeats(tmp_path, messages):
    path = str(tmp_path / "p.json")
    lifecycle = new(path, first_training_step=0)
    lifecycle.load(TENSORS, dtype="bf16")
    run_step(lifecycle, TRAIN)
    # gradient accumulation went to 2: the step runs past the profile's end
    run_step(lifecycle, GA2)
    assert lifecycle.divergences == 1 and lifecycle.profile.keys == tuple(TRAIN)  # one step proves nothing
    # the same again: the change lasts, the new sequence replaces the profile (and the file)
    run_step(lifecycle, GA2)
    assert lifecycle.profile.keys == tuple(GA2) and lifecycle.generation == 2 and lifecycle.divergences == 2
    assert load_section(path, "params", lifecycle._fingerprint).keys == tuple(GA2)
    assert any("replaces the profile" in message for message in messages)
    # and it predicts from then on
    run_step(lifecycle, GA2)
    assert lifecycle.divergences == 2 and lifecycle.phase is Phase.PREDICTING


def test_a_step_that_ends_early_is_a_divergence():
    lifecycle = new(first_training_step=0)
    run_step(lifecycle, TRAIN)
    assert run_step(lifecycle, "abc") is not None  # forward only (generation): ended before the profile did
    assert lifecycle.divergences == 1 and lifecycle.diverged_at == 3


def test_deepspeeds_first_traced_step_differs_from_its_steady_state(tmp_path):
    """Regression test: DeepSpeed's coordinator releases every parameter in its first traced step and keeps
    some from the second on, so step 1 reads more than the steps after it. The lifecycle records step 1, sees
    step 2 diverge, and adopts the steady sequence when step 3 repeats it; a restart then predicts from step 2."""
    path = str(tmp_path / "p.json")
    record_mode, steady = "abccba", "abcba"
    first = new(path)
    first.load(TENSORS)
    for keys in ("abc", record_mode, steady, steady):
        run_step(first, keys)
    assert first.profile.keys == tuple(steady) and first.source == "recorded"
    second = new(path)
    second.load(TENSORS)
    for keys in ("abc", record_mode, steady, steady):
        run_step(second, keys)
    assert second.source == "loaded" and second.divergences == 1  # only DeepSpeed's recording step


def test_an_empty_or_endless_step_changes_nothing(monkeypatch):
    from tencache_ds.profile import recorder as recorder_module
    lifecycle = new(first_training_step=0)
    assert run_step(lifecycle, "") is None and lifecycle.phase is Phase.RECORDING  # no access: nothing to learn
    monkeypatch.setattr(recorder_module, "MAX_STEP_ACCESSES", 4)
    run_step(lifecycle, "abcabcabc")  # too long to be a training step (generation): not recorded
    assert lifecycle.phase is Phase.RECORDING and lifecycle.profile is None
    run_step(lifecycle, "abc")
    assert lifecycle.phase is Phase.PREDICTING and lifecycle.profile.keys == tuple("abc")


def test_a_profile_that_cannot_be_saved_is_used_in_memory(tmp_path, messages):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    lifecycle = new(str(blocker / "profile.json"), first_training_step=0)  # its folder is a file
    lifecycle.load(TENSORS)
    assert run_step(lifecycle, TRAIN) is not None and lifecycle.phase is Phase.PREDICTING
    assert any("could not be saved" in message for message in messages)


def test_version_1_file_is_re_recorded_with_a_warning(tmp_path, messages):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"version": 1, "sections": {"params": {"fingerprint": "x", "order": [1]}}}))
    lifecycle = new(str(path), first_training_step=0)
    assert lifecycle.load(TENSORS) is None and any("version 1" in message for message in messages)
    run_step(lifecycle, TRAIN)
    assert read_sections(str(path))["params"].step.keys == tuple(TRAIN)


def test_keys_are_converted_to_and_from_the_file(tmp_path):
    path = str(tmp_path / "p.json")
    writer = new(path, first_training_step=0, to_file=lambda key: key.split("/")[-1],
                 from_file=lambda name: "/new/" + name)
    writer.load([("x", 1)])
    run_step(writer, ["/old/x", "/old/y"])
    assert read_sections(path)["params"].step.keys == ("x", "y")
    reader = new(path, to_file=lambda key: key.split("/")[-1], from_file=lambda name: "/new/" + name)
    reader.load([("x", 1)])
    assert reader.profile.keys == ("/new/x", "/new/y")


def test_a_profile_loaded_after_warm_up_predicts_from_then_on(tmp_path):
    path = str(tmp_path / "p.json")
    writer = new(path, first_training_step=0)
    writer.load(TENSORS)
    run_step(writer, TRAIN)
    late = new(path, first_training_step=0)
    run_step(late, "")  # warm-up over, nothing loaded yet
    assert late.phase is Phase.RECORDING
    assert late.load(TENSORS) is not None and late.phase is Phase.PREDICTING
    run_step(late, TRAIN)
    assert late.divergences == 0 and late.source == "loaded"


def test_a_repeat_that_reads_replaces_a_profile_that_read_nothing(tmp_path, messages):
    """A profile recorded with everything held has no read times, and reads ahead are planned from read times
    (none is, from it). A later step of the same sequence that reads NVMe (a smaller budget in this run, a tier given
    back under memory pressure) replaces it, saved; its repeats are timed from there. Until 2026-12-07 the profile
    without reads stayed for good, and the run read nothing ahead (helper-169)."""
    path = str(tmp_path / "profile.json")
    lifecycle = new(path)
    lifecycle.load(TENSORS, dtype="bf16")
    run_step(lifecycle, "abc")                     # initialisation
    run_step(lifecycle, TRAIN)                     # recorded, every access a hit
    run_step(lifecycle, TRAIN)
    assert lifecycle.profile.measured_read_bytes_per_s is None and lifecycle.generation == 1

    def read_c(key):
        if key == "c":
            lifecycle.recorder.read_took(lifecycle.recorder.position - 1, 0.5)

    run_step(lifecycle, TRAIN, check=read_c)       # the same sequence, two reads of c
    assert lifecycle.profile.keys == tuple(TRAIN) and lifecycle.generation == 2
    assert lifecycle.profile.measured_read_bytes_per_s == 4096 * 2 / 1.0
    assert lifecycle.source == "recorded" and any("its timings replace" in message for message in messages)
    assert load_section(path, "params", lifecycle._fingerprint).measured_read_bytes_per_s is not None
    run_step(lifecycle, TRAIN)                     # a hit again: the profile with reads stays
    assert lifecycle.generation == 2 and lifecycle.phase is Phase.PREDICTING
