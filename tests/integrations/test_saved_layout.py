"""What a load's copy of a checkpoint's optimizer swap files may place when they were laid out for another run:
another number of data-parallel ranks, other sub-groups, none (integrations/deepspeed/saved_layout.py), decided on
objects with only what the decision reads, and real files. The real engine, against stock CPU offload:
tests/deepspeed/test_upstream_checkpoints.py (``load_at_other_world_size``)."""
import os
import types

import pytest
import torch
from deepspeed.runtime.zero.utils import ZeRORuntimeException

from tencache_ds.errors import TencacheError
from tencache_ds.integrations.deepspeed import agreement, saved_layout
from tencache_ds.integrations.deepspeed.config_bridge import io_aligned_numel
from tencache_ds.integrations.deepspeed.optimizer_swapper import TencacheOptimizerSwapper
from tencache_ds.integrations.deepspeed.swap_files import LoadPlaces
from tencache_ds.integrations.deepspeed.saved_layout import places_for_saved_layout, sub_group_layout_mismatch

HERE = os.path.dirname(os.path.abspath(__file__))  # a folder that exists, for the checkpoint's swap files


@pytest.fixture
def engine(monkeypatch):
    """engine(saved_ranks, ranks, mismatch=None, flat_partitions=..., universal=False, missing=()): an engine whose
    checkpoint's swap files (in any folder that exists) have ``mismatch`` and lack the state files ``missing``; and
    the list its refreshes go to."""
    def make(saved_ranks, ranks, mismatch=None, flat_partitions=("flat", "flat"), universal=False, missing=()):
        monkeypatch.setattr(saved_layout, "sub_group_layout_mismatch", lambda swapper, folder: mismatch)
        monkeypatch.setattr(saved_layout, "missing_state_files", lambda engine, tag, folder: list(missing))
        monkeypatch.setattr(saved_layout, "_other_parameter_groups", lambda engine, tag: None)
        monkeypatch.setattr(saved_layout, "_masters_missing", lambda engine, tag, folder: None)
        refreshed = []
        optimizer = types.SimpleNamespace(fp16_partitioned_groups_flat=list(flat_partitions), optimizer_swapper=None,
                                          refresh_fp32_params=lambda: refreshed.append(True))
        return types.SimpleNamespace(loaded_checkpoint_dp_world_size=saved_ranks, seq_dp_world_size=ranks,
                                     optimizer=optimizer, load_universal_checkpoint=lambda: universal), refreshed

    return make


@pytest.mark.parametrize("places", [places for places in LoadPlaces if places is not LoadPlaces.MASTERS])
def test_the_same_layout_places_what_was_asked(engine, places):
    same, refreshed = engine(2, 2)
    assert places_for_saved_layout(same, places, HERE) is places and not refreshed


def test_without_the_optimizers_state_no_file_is_placed_and_the_masters_come_from_the_weights_loaded_by_name(engine):
    """Regression test (helper-192): the masters' files were placed where they fit, by position, and the engine's
    rebuild of the partitions from them undid the module's load by name: a model whose parameters were registered
    in another order (the same names and shapes) was scrambled. The masters are set from the loaded weights (as
    stock CPU offload sets them), and nothing is placed, whether the files fit or not."""
    same, refreshed = engine(2, 2)
    assert places_for_saved_layout(same, LoadPlaces.MASTERS, HERE) is LoadPlaces.NOTHING and refreshed == [True]


def test_the_optimizers_state_of_another_world_size_is_refused_as_stock_cpu_offload_refuses_it(engine):
    other, refreshed = engine(2, 1)
    with pytest.raises(ZeRORuntimeException, match="used a DP world size of 2 but the current world size is 1"):
        places_for_saved_layout(other, LoadPlaces.ALL, HERE)
    assert not refreshed


def test_the_optimizers_state_of_other_sub_groups_is_refused_naming_sub_group_size(engine):
    other, refreshed = engine(1, 1, mismatch="1 optimizer sub-groups, this engine 4")
    with pytest.raises(TencacheError, match="sub_group_size") as error:
        places_for_saved_layout(other, LoadPlaces.ALL, HERE)
    assert "1 optimizer sub-groups, this engine 4" in str(error.value) and not refreshed


@pytest.mark.parametrize("saved_ranks, mismatch", [(2, None), (1, "1 optimizer sub-groups, this engine 4")])
def test_without_the_optimizers_state_the_masters_come_from_the_loaded_weights_and_no_file_is_placed(
        engine, saved_ranks, mismatch):
    other, refreshed = engine(saved_ranks, 1, mismatch)
    assert places_for_saved_layout(other, LoadPlaces.MASTERS, HERE) is LoadPlaces.NOTHING and refreshed == [True]


def test_without_flat_partitions_the_masters_still_come_from_the_loaded_weights(engine):
    """Parameters on file beyond max_in_cpu: the refresh reads their partitions (checkpoint.set_master_from_16bit_
    weights); until 2026-12-07 this load stopped here, naming max_in_cpu (helper-196)."""
    other, refreshed = engine(4, 2, flat_partitions=("flat", None))
    assert places_for_saved_layout(other, LoadPlaces.MASTERS, HERE) is LoadPlaces.NOTHING and refreshed == [True]


def test_a_checkpoint_saved_with_the_optimizer_on_cpu_loads_its_state_from_the_zero_file(engine, tmp_path,
                                                                                         monkeypatch):
    """Regression test: its ``offloaded_tensors/rank00`` does not exist, and the engine's copy of it stopped with
    FileNotFoundError, with the optimizer's state or without it. The state is written from the checkpoint's ZeRO
    file (the tag's folder) into the swap files (zero_file.py; the real engine: test_upstream_checkpoints.py)."""
    missing = str(tmp_path / "tag" / "offloaded_tensors" / "rank00")
    saved_on_cpu, refreshed = engine(1, 1)
    loaded_from = []
    monkeypatch.setattr(saved_layout, "load_state_from_zero_file",
                        lambda engine, folder, source: loaded_from.append(folder))
    assert places_for_saved_layout(saved_on_cpu, LoadPlaces.ALL, missing) is LoadPlaces.STATE_WRITTEN
    assert loaded_from == [str(tmp_path / "tag")] and not refreshed
    assert places_for_saved_layout(saved_on_cpu, LoadPlaces.MASTERS, missing) is LoadPlaces.NOTHING and refreshed
    assert loaded_from == [str(tmp_path / "tag")]


def test_the_optimizers_state_with_state_files_missing_is_refused_naming_them(engine):
    """Regression test: a checkpoint whose swap folder lacked a moment file its ZeRO file describes (a save that
    did not finish on every rank, a copy that lost files) loaded with a warning, and a fresh engine's Adam started
    over for that sub-group (a continued engine kept its own moments from after the save, without a word). The
    masters alone (load_optimizer_states=False) still load."""
    lacking = [f"{HERE}/exp_avg_sq-{n}_{n}.tensor.swp" for n in range(5)]
    incomplete, refreshed = engine(1, 1, missing=lacking)
    with pytest.raises(TencacheError, match="the checkpoint is incomplete: 5 optimizer state file") as error:
        places_for_saved_layout(incomplete, LoadPlaces.ALL, HERE)
    assert lacking[0] in str(error.value) and "and 2 more" in str(error.value)
    assert "No swap file was placed" in str(error.value) and not refreshed
    assert places_for_saved_layout(incomplete, LoadPlaces.MASTERS, HERE) is LoadPlaces.NOTHING and refreshed


def other_rank(monkeypatch, refused=False, has_folder=True):
    """The agreement as it comes out with a second rank that refused or not and has its swap folder or not."""
    other = [int(not refused), int(has_folder), int(not has_folder)]
    monkeypatch.setattr(saved_layout, "agree_min", lambda values: [min(int(v), o) for v, o in zip(values, other)])


def test_a_refusal_on_another_rank_stops_this_one_too(engine, monkeypatch):
    """Regression test: the refusals at the copy were each rank's own, and a rank whose files were all there went
    on into the load's next collective, to wait there for the rank that had stopped."""
    fine, refreshed = engine(1, 1)
    other_rank(monkeypatch, refused=True)
    with pytest.raises(TencacheError, match="another rank refused the checkpoint's optimizer swap files"):
        places_for_saved_layout(fine, LoadPlaces.ALL, HERE)
    assert not refreshed


def test_swap_folders_of_some_ranks_only_are_an_incomplete_checkpoint(engine, monkeypatch, tmp_path):
    """A save that stopped after a rank's ZeRO file and before its swap folder: that rank would have loaded its
    state from the ZeRO file (as from a checkpoint saved with the optimizer on cpu), and failed there alone."""
    missing = str(tmp_path / "tag" / "offloaded_tensors" / "rank01")
    lacking, _refreshed = engine(1, 1)
    loaded_from = []
    monkeypatch.setattr(saved_layout, "load_state_from_zero_file",
                        lambda engine, folder, source: loaded_from.append(folder))
    other_rank(monkeypatch, has_folder=True)
    with pytest.raises(TencacheError, match="incomplete: this rank's optimizer swap folder is missing while other"):
        places_for_saved_layout(lacking, LoadPlaces.ALL, missing)
    other_rank(monkeypatch, has_folder=False)
    with pytest.raises(TencacheError, match="incomplete: other ranks' optimizer swap folders are missing"):
        places_for_saved_layout(lacking, LoadPlaces.ALL, HERE)
    assert not loaded_from


def test_a_check_that_cannot_read_the_checkpoint_is_a_refusal_naming_the_folder(engine, monkeypatch):
    unreadable, _refreshed = engine(1, 1)

    def unpickling_fails(engine, tag, folder):
        raise KeyError("fp32_flat_groups")

    monkeypatch.setattr(saved_layout, "missing_state_files", unpickling_fails)
    with pytest.raises(TencacheError, match=f"files in {HERE} could not be checked \\(KeyError") as error:
        places_for_saved_layout(unreadable, LoadPlaces.ALL, HERE)
    assert isinstance(error.value.__cause__, KeyError) and "No swap file was placed" in str(error.value)


def test_the_files_a_zero_file_describes_without_bytes_must_be_there(tmp_path):
    """described_files_absent pairs the torch optimizer's n-th parameter with the n-th sub-group, and its files with
    the checkpoint's (here under other ids: a rebuilt model). Only state saved without bytes (stage 3's empty
    placeholder, tencache's meta tensor) is looked for; a sub-group kept in memory has its state in the ZeRO file."""
    for name in ("exp_avg-0_9.tensor.swp", "exp_avg_sq-0_9.tensor.swp", "exp_avg-10_19.tensor.swp"):
        (tmp_path / name).write_bytes(b"\0" * 8)
    described = {"step": torch.tensor(2.0), "exp_avg": torch.empty(0), "exp_avg_sq": torch.empty(4, device="meta")}
    torch_state = {"param_groups": [{"params": [7, 8]}, {"params": [9]}],
                   "state": {7: dict(described), 8: dict(described), 9: {"exp_avg": torch.zeros(4)}}}
    saved_ids = {"30_39": "0_9", "40_49": "10_19"}  # the third sub-group is not swapped
    assert saved_layout.described_files_absent(torch_state, ["30_39", "40_49", "50_59"], saved_ids, str(tmp_path)) == [
        str(tmp_path / "exp_avg_sq-10_19.tensor.swp")]
    (tmp_path / "exp_avg_sq-10_19.tensor.swp").write_bytes(b"\0" * 8)
    assert saved_layout.described_files_absent(torch_state, ["30_39", "40_49", "50_59"], saved_ids, str(tmp_path)) == []


def test_a_described_file_shorter_than_its_sub_group_counts_as_missing(tmp_path):
    """Regression test (helper-210): a state file cut short (a copy that died part way) passed, was placed over the
    live one, and the first step stopped on it part way through the update, advising to delete the swap folder
    (whose file is a link to the checkpoint's). It is refused with the missing ones, before anything is placed."""
    described = {"exp_avg": torch.empty(0), "exp_avg_sq": torch.empty(4, device="meta", dtype=torch.bfloat16)}
    torch_state = {"param_groups": [{"params": [7]}], "state": {7: dict(described)}}
    (tmp_path / "exp_avg-0_9.tensor.swp").write_bytes(b"\0" * 16)    # 4 fp32 elements: whole
    (tmp_path / "exp_avg_sq-0_9.tensor.swp").write_bytes(b"\0" * 6)  # 3 of 4 bf16 elements: short
    found = saved_layout.described_files_absent(torch_state, ["30_39"], {"30_39": "0_9"}, str(tmp_path),
                                                {"30_39": 4})
    assert found == [str(tmp_path / "exp_avg_sq-0_9.tensor.swp")]
    (tmp_path / "exp_avg_sq-0_9.tensor.swp").write_bytes(b"\0" * 8)
    assert saved_layout.described_files_absent(torch_state, ["30_39"], {"30_39": "0_9"}, str(tmp_path),
                                               {"30_39": 4}) == []
    # stage 3's empty placeholder is fp32 whatever the file holds: bf16 masters' state, 2 bytes an element
    stock = {"param_groups": [{"params": [7]}], "state": {7: {"step": 3, "exp_avg": torch.empty(0)}}}
    (tmp_path / "exp_avg-0_9.tensor.swp").write_bytes(b"\0" * 8)
    assert saved_layout.described_files_absent(stock, ["30_39"], {"30_39": "0_9"}, str(tmp_path), {"30_39": 4},
                                               element_bytes=2) == []


def test_a_load_of_the_module_only_places_nothing_whatever_the_layout(engine):
    other, refreshed = engine(2, 1, mismatch="anything")
    assert places_for_saved_layout(other, LoadPlaces.NOTHING, HERE) is LoadPlaces.NOTHING and not refreshed


def swapper_with(sub_groups, intra_op=1):
    """{sub-group id: numel}, as the swapper's sub-groups; ``intra_op``: its aio.intra_op_parallelism."""
    swapper = object.__new__(TencacheOptimizerSwapper)
    swapper.swap_params_info = {sub_group: types.SimpleNamespace(numel=lambda n=numel: n)
                                for sub_group, numel in sub_groups.items()}
    swapper.dtype, swapper.swap_element_size = torch.float32, 4
    swapper.aio_config = {"intra_op_parallelism": intra_op}
    return swapper


def master_files(folder, sizes):
    for sub_group, nbytes in sizes.items():
        (folder / f"{sub_group}.tensor.swp").write_bytes(b"\0" * nbytes)
        (folder / f"exp_avg-{sub_group}.tensor.swp").write_bytes(b"\0" * 8)  # moments do not count


def test_sub_groups_fit_under_other_ids_and_another_aio_padding(tmp_path):
    master_files(tmp_path, {"0_9": io_aligned_numel(1000, torch.float32, 4) * 4,
                            "10_19": io_aligned_numel(300000, torch.float32, 4) * 4})
    assert sub_group_layout_mismatch(swapper_with({"30_39": 1000, "40_49": 300000}), str(tmp_path)) is None


def test_master_files_padded_less_than_this_engine_reads_do_not_fit(tmp_path):
    """Regression (helper-182's review): saved at aio.intra_op_parallelism 1, loaded at 8, a master file is shorter
    than the engine reads; it was accepted, placed, and its read stopped the load ("truncated") after the live files
    were replaced. Padded more than this engine reads (saved at 8, loaded at 1), it fits."""
    master_files(tmp_path, {"0_9": io_aligned_numel(1000, torch.float32, 1) * 4})
    assert io_aligned_numel(1000, torch.float32, 1) < io_aligned_numel(1000, torch.float32, 8)
    mismatch = sub_group_layout_mismatch(swapper_with({"0_9": 1000}, intra_op=8), str(tmp_path))
    assert "aio.intra_op_parallelism than this engine's 8" in mismatch, mismatch
    master_files(tmp_path, {"0_9": io_aligned_numel(1000, torch.float32, 8) * 4})
    assert sub_group_layout_mismatch(swapper_with({"0_9": 1000}, intra_op=1), str(tmp_path)) is None


def test_another_count_or_size_of_sub_groups_does_not_fit(tmp_path):
    """Regression test: a checkpoint saved with another sub_group_size (one sub-group, this engine four) was
    loaded as if it fitted: adoption skipped it with a warning, and the parameters were rebuilt from the live
    masters, the loaded weights silently dropped."""
    master_files(tmp_path, {"0_39": 400000 * 4})
    four = swapper_with({"0_9": 100000, "10_19": 100000, "20_29": 100000, "30_39": 100000})
    assert sub_group_layout_mismatch(four, str(tmp_path)) == "1 optimizer sub-groups, this engine 4"
    mismatch = sub_group_layout_mismatch(swapper_with({"0_39": 200000}), str(tmp_path))
    assert mismatch == "sub-group 0_39's master file holds 1600000 bytes, for this engine's sub-group 0_39 of 200000 " \
                       "elements"


def test_a_checkpoint_with_other_engines_files_beside_this_ones_fits_by_id(tmp_path):
    """Stock's save copies the whole swap folder, which engines alive at once share: the checkpoint then holds
    another engine's sub-groups beside this one's. This engine's own ids, at their sizes, fit."""
    master_files(tmp_path, {"0_9": 4096, "10_19": io_aligned_numel(500000, torch.float32, 1) * 4, "20_29": 7})
    assert sub_group_layout_mismatch(swapper_with({"10_19": 500000}), str(tmp_path)) is None
    assert sub_group_layout_mismatch(swapper_with({"10_19": 400000}), str(tmp_path)) == (
        "sub-group 10_19's master file holds 2000896 bytes, for this engine's sub-group 10_19 of 400000 elements")


@pytest.mark.parametrize("places, loads, placed", [
    (LoadPlaces.ALL, "state", LoadPlaces.STATE_WRITTEN), (LoadPlaces.MASTERS, "weights", LoadPlaces.NOTHING),
    (LoadPlaces.NOTHING, "weights", LoadPlaces.NOTHING)])
def test_a_universal_checkpoint_is_loaded_from_its_own_files_at_any_world_size(engine, monkeypatch, tmp_path, places,
                                                                              loads, placed):
    """Regression test: the NVMe load path neither finds swap files in it nor calls the function that loads its
    weights (it was refused). Its state or its weights are written from its files (universal.py; the real engine:
    test_upstream_checkpoints.py)."""
    universal, refreshed = engine(2, 1, universal=True)
    loaded = []
    monkeypatch.setattr(saved_layout, "load_state_from_universal", lambda engine, folder: loaded.append(("state",
                                                                                                        folder)))
    monkeypatch.setattr(saved_layout, "load_weights_from_universal", lambda engine, folder: loaded.append(("weights",
                                                                                                          folder)))
    source = str(tmp_path / "universal" / "offloaded_tensors" / "rank00")
    assert places_for_saved_layout(universal, places, source) is placed
    assert loaded == [(loads, str(tmp_path / "universal"))] and not refreshed


def test_a_folder_that_is_not_a_universal_checkpoint_is_refused(engine, tmp_path):
    universal, _refreshed = engine(1, 1, universal=True)
    with pytest.raises(TencacheError, match="ds_to_universal's output"):
        places_for_saved_layout(universal, LoadPlaces.ALL, str(tmp_path / "tag" / "offloaded_tensors" / "rank00"))


def agreements(monkeypatch, *others):
    """The agreement as it comes out with a second rank whose values are ``others[k]`` at the k-th call."""
    calls = list(others)

    def agree_min(values):
        return [min(int(v), o) for v, o in zip(values, calls.pop(0))]

    monkeypatch.setattr(saved_layout, "agree_min", agree_min)
    monkeypatch.setattr(agreement, "agree_min", agree_min)


def test_a_zero_file_that_another_rank_cannot_load_stops_every_rank(engine, monkeypatch, tmp_path):
    """Regression test (helper-152's review): a checkpoint saved with the optimizer on cpu, whose ZeRO file one rank
    cannot load (missing, unreadable, its masters without bytes). That rank stopped alone, and the others went on
    into the load's next collective, to wait there. Now every rank stops; this rank's own error is its own."""
    missing = str(tmp_path / "tag" / "offloaded_tensors" / "rank00")
    saved_on_cpu, _refreshed = engine(1, 1)
    monkeypatch.setattr(saved_layout, "load_state_from_zero_file", lambda engine, folder, source: None)
    agreements(monkeypatch, [1, 0, 1], [0])  # the folders agreed (none anywhere), then the other rank's load failed
    with pytest.raises(TencacheError, match="another rank could not load its optimizer state"):
        places_for_saved_layout(saved_on_cpu, LoadPlaces.ALL, missing)

    def unreadable(engine, folder, source):
        raise TencacheError("this rank's ZeRO file holds no optimizer state")

    monkeypatch.setattr(saved_layout, "load_state_from_zero_file", unreadable)
    agreements(monkeypatch, [1, 0, 1], [1])
    with pytest.raises(TencacheError, match="this rank's ZeRO file"):
        places_for_saved_layout(saved_on_cpu, LoadPlaces.ALL, missing)


def test_without_the_state_every_rank_sets_its_masters_from_the_weights_whatever_its_files(engine, monkeypatch):
    """Regression test (helper-152's review): load_optimizer_states=False decided each rank alone whether its files
    fit; a rank that placed its masters and one that set them from the loaded weights went on into different
    collectives. Every rank sets them from the weights now (helper-192), asking no rank about its files."""
    fine, refreshed = engine(1, 1)
    agreements(monkeypatch, [1])  # (the refresh's own: done on every rank)
    assert places_for_saved_layout(fine, LoadPlaces.MASTERS, HERE) is LoadPlaces.NOTHING and refreshed == [True]


def test_a_universal_checkpoint_another_rank_cannot_load_stops_every_rank(engine, monkeypatch, tmp_path):
    """As a ZeRO file's: a universal checkpoint's state (or weights) that one rank cannot load stops every rank,
    not that rank alone while the others go on into the load's next collective."""
    universal, _refreshed = engine(1, 2, universal=True)
    source = str(tmp_path / "tag" / "offloaded_tensors" / "rank00")
    monkeypatch.setattr(saved_layout, "load_state_from_universal", lambda engine, folder: None)
    monkeypatch.setattr(saved_layout, "load_weights_from_universal", lambda engine, folder: None)
    agreements(monkeypatch, [0])
    with pytest.raises(TencacheError, match="another rank could not load its optimizer state"):
        places_for_saved_layout(universal, LoadPlaces.ALL, source)
    agreements(monkeypatch, [0])
    with pytest.raises(TencacheError, match="another rank could not load its weights"):
        places_for_saved_layout(universal, LoadPlaces.MASTERS, source)
    agreements(monkeypatch, [1])
    assert places_for_saved_layout(universal, LoadPlaces.ALL, source) is LoadPlaces.STATE_WRITTEN


def test_masters_another_rank_cannot_set_from_the_weights_stop_every_rank(engine, monkeypatch):
    """Regression test (helper-156's review): load_optimizer_states=False where the files do not fit, and one rank's
    refresh of the masters from the loaded weights fails (its drive): that rank stopped alone, and the others went
    on into the load's gathers. Now every rank stops (as on the universal path)."""
    fine, refreshed = engine(1, 1)
    agreements(monkeypatch, [0], [0])
    with pytest.raises(TencacheError, match="another rank could not set its fp32 masters"):
        places_for_saved_layout(fine, LoadPlaces.MASTERS, HERE)
    assert refreshed == [True]


def test_a_checkpoint_folder_one_rank_cannot_read_stops_every_ranks_load_before_its_agreements(monkeypatch,
                                                                                                tmp_path):
    """Regression test (helper-156's review): the copy's start lists the checkpoint's folder and tidies the swap
    folder before the load's agreements (places_for_saved_layout); an OSError there on one rank (EIO, ESTALE)
    left the others waiting in those agreements. Now every rank stops there, nothing placed."""
    swapper = swapper_with({0: 10})
    swapper._load_places = LoadPlaces.ALL
    agreed = []
    swapper._before_load_copy = lambda places, source: agreed.append(source) or places

    def unreadable():
        raise OSError(5, "Input/output error")

    agreements(monkeypatch, [0])
    monkeypatch.setattr(swapper, "drop_staged_loads", lambda: None)
    with pytest.raises(TencacheError, match="another rank could not read its checkpoint folder"):
        swapper.begin_load_copy(str(tmp_path))
    agreements(monkeypatch, [1])
    monkeypatch.setattr(swapper, "drop_staged_loads", unreadable)
    with pytest.raises(OSError, match="Input/output error"):
        swapper.begin_load_copy(str(tmp_path))
    assert agreed == []
    agreements(monkeypatch, [1])
    monkeypatch.setattr(swapper, "drop_staged_loads", lambda: None)
    swapper.begin_load_copy(str(tmp_path))
    assert agreed == [str(tmp_path)] and swapper.last_load_places is LoadPlaces.ALL


def test_a_load_copy_that_stops_part_way_leaves_the_live_swap_files_whole(monkeypatch, tmp_path):
    """Regression test (helper-155's review): a resume (the checkpoint's sub-group ids this engine's) whose copy of the
    checkpoint's swap files stops part way (no room where they are copied, a drive's error, Ctrl-C): each placed file
    had replaced its live one, so the folder held some of the checkpoint's files and the rest of the engine's, which a
    caller that caught the error and trained on then read. Now the copy places them hidden and renames them over the
    live ones once all are placed. A copy that finishes replaces every live file."""
    from tencache_ds.integrations.deepspeed import checkpoint_save
    live, saved = tmp_path / "swap", tmp_path / "checkpoint"
    live.mkdir()
    saved.mkdir()
    names = ["1_0.tensor.swp", "exp_avg-1_0.tensor.swp", "1_1.tensor.swp", "exp_avg-1_1.tensor.swp"]
    for name in names:
        (live / name).write_bytes(b"live")
        (saved / name).write_bytes(b"saved")
    swapper = swapper_with({"1_0": 1, "1_1": 1})
    swapper._folder = str(live)
    swapper._load_places, swapper._before_load_copy = LoadPlaces.ALL, None
    place = checkpoint_save.place
    placed = []

    def no_room_at_the_third(source, target, fill=None):
        if len(placed) == 2:
            raise OSError(28, "No space left on device")
        placed.append(target)
        return place(source, target, fill)

    monkeypatch.setattr(checkpoint_save, "place", no_room_at_the_third)
    with pytest.raises(OSError, match="No space left"):
        checkpoint_save._link_folder(swapper, str(saved), str(live), None, "load")
    assert all((live / name).read_bytes() == b"live" for name in names)
    assert sorted(os.listdir(live)) == sorted(names)  # the copies placed so far gone with the error (helper-158)
    monkeypatch.setattr(checkpoint_save, "place", place)
    checkpoint_save._link_folder(swapper, str(saved), str(live), None, "load")
    assert sorted(os.listdir(live)) == sorted(names)
    assert all((live / name).read_bytes() == b"saved" for name in names)


def test_a_load_copied_across_file_systems_without_room_for_both_replaces_file_by_file(monkeypatch, tmp_path):
    """Regression test (helper-158's review): placed hidden until all are placed, a copy (the checkpoint on another
    file system) takes as much room again as the live files; a load that fitted stopped on no room. Where the room
    is not there, each file replaces its live one as it is copied, as before; where it is, they are staged."""
    from tencache_ds.integrations.deepspeed import optimizer_swapper
    live, saved = tmp_path / "swap", tmp_path / "checkpoint"
    live.mkdir()
    saved.mkdir()
    (saved / "1_0.tensor.swp").write_bytes(b"\0" * 4096)
    swapper = swapper_with({"1_0": 1})
    swapper._folder = str(live)
    real_link = os.link

    def across_mounts(source, target, *args, **kwargs):  # two mounts of one file system: EXDEV (helper-164)
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(optimizer_swapper.os, "link", across_mounts)
    for free, staged in ((4096 * 8, True), (4095, False)):
        monkeypatch.setattr(optimizer_swapper.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=free))
        assert swapper._room_to_stage(str(saved), ["1_0.tensor.swp"]) is staged
    monkeypatch.setattr(optimizer_swapper.os, "link", real_link)
    assert swapper._room_to_stage(str(saved), ["1_0.tensor.swp"])  # linked: no room needed
    assert sorted(os.listdir(live)) == []  # the link's probe undone
