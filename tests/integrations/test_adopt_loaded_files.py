"""A rebuilt engine's adoption of a checkpoint's swap files (integrations/deepspeed/checkpoint.py
``adopt_loaded_files``): each loaded file is renamed to this engine's sub-group id, in sub-group order, without
DeepSpeed's engine (a swapper object with only what adoption reads: its folder, its sub-group ids, its store)."""
import os
import types

import pytest

from tencache_ds.integrations.deepspeed.checkpoint import adopt_loaded_files
from tencache_ds.integrations.deepspeed.optimizer_swapper import TencacheOptimizerSwapper


def engine_with(folder, sub_groups):
    swapper = object.__new__(TencacheOptimizerSwapper)  # no DeepSpeed: only the attributes adoption reads
    swapper._folder = str(folder)
    swapper.swap_params_info = dict.fromkeys(sub_groups)
    forgotten = []
    swapper.store = types.SimpleNamespace(forget=forgotten.append)
    rebuilt = []
    optimizer = types.SimpleNamespace(optimizer_swapper=swapper, reset_swap_buffers=lambda: rebuilt.append(True))
    return types.SimpleNamespace(optimizer=optimizer), forgotten, rebuilt


def files(folder, sub_groups, states, tag):
    for sub_group in sub_groups:
        for state in states:
            prefix = f"{state}-" if state else ""
            (folder / f"{prefix}{sub_group}.tensor.swp").write_text(f"{tag}:{prefix}{sub_group}")


@pytest.mark.parametrize("masters_only", [False, True])
def test_ids_shifted_by_whole_sub_groups_are_renamed_without_overwriting_a_loaded_file(tmp_path, masters_only):
    """Regression test: the checkpoint's ids (0_9, 10_19) and this engine's (10_19, 20_29) overlap. Renaming in one
    pass moved 0_9's file onto 10_19 before 10_19's own file had gone to 20_29: that file was lost and the next
    rename found nothing (FileNotFoundError). Without the optimizer's state only the masters are renamed; this
    engine's live moments stay under its ids."""
    tag_dir = tmp_path / "ckpt" / "tag"
    loaded = tag_dir / "offloaded_tensors" / "rank00"
    folder = tmp_path / "nvme" / "optimizer" / "rank0"
    loaded.mkdir(parents=True)
    folder.mkdir(parents=True)
    files(loaded, ["0_9", "10_19"], [None, "exp_avg"], "checkpoint")  # what the checkpoint holds
    files(folder, ["20_29"], ["exp_avg"], "live")  # this engine's own moments, not overwritten by the copy
    files(folder, ["0_9", "10_19"], [None] if masters_only else [None, "exp_avg"], "checkpoint")  # the copy
    engine, forgotten, rebuilt = engine_with(folder, ["10_19", "20_29"])
    renamed = adopt_loaded_files(engine, str(tmp_path / "ckpt"), str(tag_dir / "mp_rank_00_model_states.pt"),
                                 masters_only=masters_only)
    assert renamed == (2 if masters_only else 4) and rebuilt == [True]
    assert (folder / "10_19.tensor.swp").read_text() == "checkpoint:0_9"
    assert (folder / "20_29.tensor.swp").read_text() == "checkpoint:10_19"
    moments = (folder / "exp_avg-20_29.tensor.swp").read_text()
    assert moments == ("live:exp_avg-20_29" if masters_only else "checkpoint:exp_avg-10_19")
    assert not [name for name in os.listdir(folder) if name.startswith(".")]  # nothing left staged
    assert sorted(os.path.basename(path) for path in forgotten) == sorted(
        f"{prefix}{new}.tensor.swp" for new in ("10_19", "20_29")
        for prefix in ([""] if masters_only else ["", "exp_avg-"]))
