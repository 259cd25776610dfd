"""A rebuilt engine's adoption of a checkpoint's swap files (integrations/deepspeed/checkpoint.py
``adopt_loaded_files``): each loaded file is renamed to this engine's sub-group id, in sub-group order; and the
load's copy of the checkpoint's files (checkpoint_save.py ``_link_folder``) before it, which places the files of
sub-groups the engine does not have hidden. Without DeepSpeed's engine (a swapper object with only what the copy and
adoption read: its folder, its sub-group ids, its store, what the load places), on real files."""
import logging
import os
import types

import pytest
import torch

from tencache_ds.integrations.deepspeed.checkpoint import adopt_loaded_files
from tencache_ds.integrations.deepspeed.checkpoint_save import _link_folder
from tencache_ds.integrations.deepspeed.masters_in_partitions import MastersInPartitions
from tencache_ds.integrations.deepspeed.optimizer_swapper import TencacheOptimizerSwapper
from tencache_ds.integrations.deepspeed.swap_files import LoadPlaces, staged_load_name


def engine_with(folder, sub_groups):
    swapper = object.__new__(TencacheOptimizerSwapper)  # no DeepSpeed: only the attributes adoption reads
    swapper._folder = str(folder)
    swapper.swap_params_info = dict.fromkeys(sub_groups)
    swapper._state_dtypes = {}  # no state in another dtype than the masters' (test_optimizer_state_dtype.py)
    swapper._load_places = LoadPlaces.ALL
    swapper._before_load_copy = None
    swapper.last_load_places = swapper.last_load_source = None
    swapper.masters = MastersInPartitions(None, torch.float32, None, False)  # no partition holds a master
    forgotten = []
    swapper.store = types.SimpleNamespace(forget=forgotten.append)
    rebuilt = []
    optimizer = types.SimpleNamespace(optimizer_swapper=swapper, reset_swap_buffers=lambda: rebuilt.append(True))
    return types.SimpleNamespace(optimizer=optimizer), forgotten, rebuilt


def load_copy(engine, loaded, folder, places):
    """The engine's copy of the checkpoint's folder over the swap folder, as load_checkpoint makes it."""
    swapper = engine.optimizer.optimizer_swapper
    swapper._load_places = places
    _link_folder(swapper, str(loaded), str(folder), None, "load")
    swapper._load_places = LoadPlaces.ALL


def files(folder, sub_groups, states, tag):
    for sub_group in sub_groups:
        for state in states:
            prefix = f"{state}-" if state else ""
            (folder / f"{prefix}{sub_group}.tensor.swp").write_text(f"{tag}:{prefix}{sub_group}")


def test_ids_shifted_by_whole_sub_groups_are_renamed_without_overwriting_a_loaded_file(tmp_path):
    """Regression test: the checkpoint's ids (0_9, 10_19) and this engine's (10_19, 20_29) overlap. Renaming in one
    pass moved 0_9's file onto 10_19 before 10_19's own file had gone to 20_29: that file was lost and the next
    rename found nothing (FileNotFoundError). (A load without the optimizer's state places no file since 2026-12-07:
    test_saved_layout.py.) Until 2026-12-07 the copy placed the checkpoint's 10_19 under its own
    name, over this engine's live 10_19, until adoption."""
    tag_dir, loaded, folder = checkpoint_and_swap_folders(tmp_path)
    files(loaded, ["0_9", "10_19"], [None, "exp_avg"], "checkpoint")  # what the checkpoint holds
    files(folder, ["10_19", "20_29"], [None, "exp_avg"], "live")  # this engine's own state
    engine, forgotten, rebuilt = engine_with(folder, ["10_19", "20_29"])
    load_copy(engine, loaded, folder, LoadPlaces.ALL)
    # every loaded file hidden until adoption: the live 10_19 is not the checkpoint's 10_19, which the engine's
    # reset right after the copy read as its own and wrote back changed (helper-143's review)
    assert (folder / "10_19.tensor.swp").read_text() == "live:10_19"
    renamed = adopt_loaded_files(engine, str(tmp_path / "ckpt"), str(tag_dir / "mp_rank_00_model_states.pt"))
    assert renamed == 4 and rebuilt == [True]
    assert (folder / "10_19.tensor.swp").read_text() == "checkpoint:0_9"
    assert (folder / "20_29.tensor.swp").read_text() == "checkpoint:10_19"
    assert (folder / "exp_avg-20_29.tensor.swp").read_text() == "checkpoint:exp_avg-10_19"
    assert not [name for name in os.listdir(folder) if name.startswith(".")]  # nothing left staged
    assert sorted(os.path.basename(path) for path in forgotten) == sorted(
        f"{prefix}{new}.tensor.swp" for new in ("10_19", "20_29") for prefix in ("", "exp_avg-"))


def checkpoint_and_swap_folders(tmp_path):
    """(a checkpoint's tag folder, its swap files' folder of rank 0, an engine's swap folder), the last two made."""
    tag_dir = tmp_path / "ckpt" / "tag"
    loaded = tag_dir / "offloaded_tensors" / "rank00"
    folder = tmp_path / "nvme" / "optimizer" / "rank0"
    loaded.mkdir(parents=True)
    folder.mkdir(parents=True)
    return tag_dir, loaded, folder


def test_a_load_never_replaces_the_files_of_another_engine_sharing_the_folder(tmp_path):
    """Regression test: two engines alive in one process share the swap folder (one config, one nvme_path), the
    critic with sub-groups 0_9 and 10_19, the actor with 20_29 and 30_39. The actor loads a checkpoint written by
    another process where its ids were 0_9 and 10_19. The copy placed the checkpoint's files under their own names,
    over the critic's live files, before adoption renamed them to the actor's ids: the critic's masters and moments
    were the actor's from then on. The copy now places them hidden, adoption takes them from there, and nothing of
    the critic's changes."""
    tag_dir, loaded, folder = checkpoint_and_swap_folders(tmp_path)
    files(loaded, ["0_9", "10_19"], [None, "exp_avg"], "checkpoint")
    files(folder, ["0_9", "10_19"], [None, "exp_avg"], "critic")
    files(folder, ["20_29", "30_39"], [None, "exp_avg"], "actor")
    critic_files = {name: (folder / name).read_text() for name in os.listdir(folder) if "critic" in
                    (folder / name).read_text()}
    actor, _, rebuilt = engine_with(folder, ["20_29", "30_39"])
    load_copy(actor, loaded, folder, LoadPlaces.ALL)
    assert {name: (folder / name).read_text() for name in critic_files} == critic_files
    renamed = adopt_loaded_files(actor, str(tmp_path / "ckpt"), str(tag_dir / "mp_rank_00_model_states.pt"))
    assert renamed == 4 and rebuilt == [True]
    assert {name: (folder / name).read_text() for name in critic_files} == critic_files
    assert (folder / "20_29.tensor.swp").read_text() == "checkpoint:0_9"
    assert (folder / "30_39.tensor.swp").read_text() == "checkpoint:10_19"
    assert (folder / "exp_avg-30_39.tensor.swp").read_text() == "checkpoint:exp_avg-10_19"
    assert not [name for name in os.listdir(folder) if name.startswith(".")]


def test_files_of_a_checkpoint_with_other_sub_groups_are_not_left_in_the_folder(tmp_path):
    """A checkpoint of another model (3 sub-groups against this engine's 2), copied in (here without the layout
    check that now refuses it first: saved_layout.py), is not adopted (a warning, as in stock DeepSpeed); the files
    its load placed hidden are deleted, and this engine's own stay."""
    tag_dir, loaded, folder = checkpoint_and_swap_folders(tmp_path)
    files(loaded, ["0_9", "10_19", "20_29"], [None, "exp_avg"], "checkpoint")
    files(folder, ["30_39", "40_49"], [None, "exp_avg"], "live")
    engine, _, rebuilt = engine_with(folder, ["30_39", "40_49"])
    load_copy(engine, loaded, folder, LoadPlaces.ALL)
    assert len([name for name in os.listdir(folder) if name.startswith(".")]) == 6
    assert adopt_loaded_files(engine, str(tmp_path / "ckpt"), str(tag_dir / "mp_rank_00_model_states.pt")) == 0
    assert rebuilt == []
    assert sorted(os.listdir(folder)) == sorted(f"{prefix}{sub_group}.tensor.swp" for sub_group in ("30_39", "40_49")
                                                for prefix in ("", "exp_avg-"))


def test_files_a_failed_load_left_staged_go_at_the_next_load(tmp_path):
    """A load that stops after the copy (before adoption) leaves the checkpoint's files hidden in the folder; the
    next load's copy deletes them before it places anything."""
    tag_dir, loaded, folder = checkpoint_and_swap_folders(tmp_path)
    files(loaded, ["0_9"], [None], "checkpoint")
    files(folder, ["10_19"], [None], "live")
    engine, _, _ = engine_with(folder, ["10_19"])
    load_copy(engine, loaded, folder, LoadPlaces.ALL)  # ... and the load stops here
    assert (folder / staged_load_name("0_9.tensor.swp")).exists()
    (loaded / "0_9.tensor.swp").unlink()  # the next checkpoint has no file of that id
    load_copy(engine, loaded, folder, LoadPlaces.ALL)
    assert sorted(os.listdir(folder)) == ["10_19.tensor.swp"]


def test_a_checkpoint_with_this_engines_sub_groups_beside_other_engines_files_needs_no_adoption(tmp_path):
    """Stock's save of a folder two engines share takes both engines' files. This engine's own ids are placed
    under their names and nothing is renamed (before: "not adopted", a warning for a load that was right); the
    other engine's files, placed hidden, go."""
    tag_dir, loaded, folder = checkpoint_and_swap_folders(tmp_path)
    files(loaded, ["0_9", "10_19"], [None, "exp_avg"], "checkpoint")
    files(folder, ["10_19"], [None, "exp_avg"], "live")
    engine, _, rebuilt = engine_with(folder, ["10_19"])
    load_copy(engine, loaded, folder, LoadPlaces.ALL)
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warnings.append
    logging.getLogger("tencache_ds").addHandler(handler)  # the package logger does not propagate (log.py)
    try:
        assert adopt_loaded_files(engine, str(tmp_path / "ckpt"), str(tag_dir / "mp_rank_00_model_states.pt")) == 0
    finally:
        logging.getLogger("tencache_ds").removeHandler(handler)
    assert warnings == []
    assert rebuilt == [] and sorted(os.listdir(folder)) == ["10_19.tensor.swp", "exp_avg-10_19.tensor.swp"]
    assert (folder / "10_19.tensor.swp").read_text() == "checkpoint:10_19"


def test_an_adoption_that_stops_part_way_leaves_nothing_renamed_behind(tmp_path):
    """Regression test (helper-155's review): adoption's first pass renames each loaded file to a hidden name of its
    own kind; one that raised there (a loaded file gone) left those renamed so far (whole swap files) until a later
    start swept them. Now they go with the error, and the live files stay."""
    tag_dir, loaded, folder = checkpoint_and_swap_folders(tmp_path)
    files(loaded, ["0_9", "10_19"], [None, "exp_avg"], "checkpoint")
    files(folder, ["20_29", "30_39"], [None, "exp_avg"], "live")
    engine, _forgotten, rebuilt = engine_with(folder, ["20_29", "30_39"])
    load_copy(engine, loaded, folder, LoadPlaces.ALL)
    swapper = engine.optimizer.optimizer_swapper
    os.remove(folder / swapper.load_target_name("exp_avg-10_19.tensor.swp"))  # the last one renamed: gone
    with pytest.raises(FileNotFoundError):
        adopt_loaded_files(engine, str(tmp_path / "ckpt"), str(tag_dir / "mp_rank_00_model_states.pt"))
    assert not [name for name in os.listdir(folder) if name.startswith(".")] and rebuilt == []
    assert (folder / "20_29.tensor.swp").read_text() == "live:20_29"
