"""Engines alive at once in one process each get their own file or section (integrations/deepspeed/
engine_ordinals.py): the profile section an optimizer swapper records in (profiling.profile_section), its own among
those alive, the first one's "optimizer" again once it is closed or gone; the metrics file of an engine (reporting.
engine_metrics_path); and what a section's name says it profiles (profile/store.section_kind). The real engines:
test_parity.py's test_two_engines_trained_at_once_each_reuse_their_own_optimizer_profile_and_meter_to_their_own_file.
"""
import gc

from tencache_ds.integrations.deepspeed.profiling import profile_section
from tencache_ds.integrations.deepspeed.reporting import engine_metrics_file, engine_metrics_path
from tencache_ds.profile.store import section_kind


class Swapper:
    closed = False


def test_optimizers_alive_at_once_get_their_own_sections_and_a_closed_ones_is_free_again(tmp_path):
    path = str(tmp_path / "profile.json")
    actor, critic = Swapper(), Swapper()
    sections = (profile_section("optimizer", path, actor), profile_section("optimizer", path, critic))
    assert sections == ("optimizer", "optimizer-2")
    assert profile_section("optimizer", str(tmp_path / "other.json"), Swapper()) == "optimizer"  # another file: its own
    actor.closed = True  # destroyed: the next engine made is "the first" again, as in a run that makes it first
    reward = Swapper()
    assert profile_section("optimizer", path, reward) == "optimizer"
    del critic
    gc.collect()  # gone without a close: its ordinal is free too
    assert profile_section("optimizer", path, Swapper()) == "optimizer-2"


def test_a_sections_kind_is_its_name_without_an_ordinal():
    assert [section_kind(name) for name in ("params", "optimizer", "optimizer-2", "optimizer-12", "optimizer-x")] \
        == ["params", "optimizer", "optimizer", "optimizer", "optimizer-x"]


def test_a_second_engines_metrics_go_beside_the_firsts():
    assert [engine_metrics_path("runs/metrics.jsonl", ordinal) for ordinal in (0, 1, 2)] == \
        ["runs/metrics.jsonl", "runs/metrics.engine2.jsonl", "runs/metrics.engine3.jsonl"]
    assert engine_metrics_path("metrics", 1) == "metrics.engine2"


def test_parameter_swappers_alive_at_once_get_their_own_sections(tmp_path):
    """Two engines with nvme_paths of their own have a parameter swapper each: "params" and "params-2" (helper-169:
    both wrote "params", each run finding the other's profile, stale); the optimizers' ordinals are counted apart."""
    path = str(tmp_path / "profile.json")
    first, second = Swapper(), Swapper()
    assert (profile_section("params", path, first), profile_section("params", path, second)) == ("params", "params-2")
    assert profile_section("optimizer", path, Swapper()) == "optimizer"
    assert section_kind("params-2") == "params"


def test_a_file_spelled_two_ways_is_one(tmp_path, monkeypatch):
    """Engines whose paths name one file differently ("runs/m.jsonl", "./runs/m.jsonl") get ordinals of one file:
    each keyed its own, both were the first, and both wrote into one file (helper-174)."""
    monkeypatch.chdir(tmp_path)
    actor, critic = Swapper(), Swapper()
    assert (profile_section("params", "runs/p.json", actor), profile_section("params", "./runs/p.json", critic)) \
        == ("params", "params-2")
    assert (engine_metrics_file("runs/m.jsonl", actor), engine_metrics_file("./runs/m.jsonl", critic)) \
        == ("runs/m.jsonl", "./runs/m.engine2.jsonl")
