"""The ZeRO file written through DeepSpeed's own TorchCheckpointEngine while the masters come from the swap files
(integrations/deepspeed/checkpoint_save.py, ``_saving_from_files``): where that save fails, the engine's
usual save makes the file, with a warning that names the cause, and the engine's own method is back afterwards; which
engines are shown the host tier's own buffers, and the refusal of copies the host, or the /dev/shm torch would put
them in, has no room for."""
import logging
import os
import types

import pytest
import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

from tencache_ds.errors import TencacheOutOfMemory, TencacheResourceError
from tencache_ds.integrations.deepspeed.checkpoint_save import (MasterSources, _check_room_for_copies,
                                                                _copy_for_a_later_writer, _saves_from_files,
                                                                _saving_from_files, serialises_during_save)
from tencache_ds.integrations.deepspeed.optimizer_swapper import CheckpointTotals


def test_a_save_from_the_swap_files_that_fails_falls_back_to_the_engines_own_save(tmp_path):
    master = torch.randn(10_000)
    engine = TorchCheckpointEngine()
    swapper = types.SimpleNamespace(last_zero_file_save="untouched", checkpoint_totals=CheckpointTotals())
    missing = MasterSources(swapper)
    missing[master.untyped_storage().data_ptr()] = str(tmp_path / "gone.swp")  # its swap file cannot be read
    path = str(tmp_path / "tag" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger("tencache_ds").addHandler(handler)  # the package logger does not propagate (log.py)
    try:
        with _saving_from_files(engine, missing, swapper):
            engine.save({"fp32_flat_groups": [master]}, path)
    finally:
        logging.getLogger("tencache_ds").removeHandler(handler)
    assert torch.equal(torch.load(path, weights_only=False)["fp32_flat_groups"][0], master)
    assert swapper.last_zero_file_save is None
    assert swapper.checkpoint_totals == CheckpointTotals(zero_files_saved_usual_way=1)  # counted in the swapper's stats
    assert any("written the usual way (masters not taken from the swap files): FileNotFoundError" in record.getMessage()
               for record in records)
    assert "save" not in vars(engine) and os.listdir(os.path.dirname(path)) == [os.path.basename(path)]


def test_a_full_disk_stops_the_save_with_its_own_error_rather_than_a_second_attempt(tmp_path, monkeypatch):
    """io/save_from_files.py names the folder and the checkpoint's save_dir when the disk is full
    (tests/io/test_save_from_files.py); the usual save would write the whole file again to the same disk."""
    from tencache_ds.io import save_from_files
    full = TencacheResourceError(f"no space left on {tmp_path} while writing 4 MiB to zero.pt (0 B free)")

    def save_on_a_full_disk(state_dict, path, sources):
        raise full

    monkeypatch.setattr(save_from_files, "save_from_files", save_on_a_full_disk)
    engine = TorchCheckpointEngine()
    swapper = types.SimpleNamespace(last_zero_file_save="untouched", checkpoint_totals=CheckpointTotals())
    path = str(tmp_path / "tag" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with _saving_from_files(engine, {}, swapper), pytest.raises(TencacheResourceError) as raised:
        engine.save({"fp32_flat_groups": [torch.randn(10)]}, path)
    assert raised.value is full
    assert not os.path.exists(path) and swapper.checkpoint_totals == CheckpointTotals()
    assert "save" not in vars(engine)


def test_only_deepspeeds_synchronous_engines_are_shown_the_tiers_own_buffers():
    """Any other checkpoint engine (DeepSpeed's decoupled writer, a subclass that may write later) gets copies of the
    masters (tests/deepspeed/test_zero_to_fp32.py runs one through the real engine)."""
    class Later(TorchCheckpointEngine):
        pass

    assert serialises_during_save(TorchCheckpointEngine())
    assert not serialises_during_save(Later())
    assert not serialises_during_save(types.SimpleNamespace(save=lambda state_dict, path: None))


def test_copies_the_host_has_no_memory_for_are_refused_naming_the_key():
    with pytest.raises(TencacheOutOfMemory, match=r'checkpoint\.writer.*"decoupled": false'):
        _check_room_for_copies(1 << 60)  # an exbibyte: more than any host has available
    _check_room_for_copies(1 << 20)


def test_copies_torch_would_put_in_a_dev_shm_too_small_for_them_are_refused_naming_it(tmp_path):
    """Under torch's "file_system" sharing strategy the queue copies even a memory file into /dev/shm by name."""
    master = torch.randn(1000)
    assert torch.equal(_copy_for_a_later_writer(master), master)
    strategy = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        _check_room_for_copies(1 << 10, dev_shm=str(tmp_path))  # a folder with room for 1 KiB
        with pytest.raises(TencacheOutOfMemory, match=rf'"file_system" sharing strategy.* puts in {tmp_path}'):
            _check_room_for_copies(1 << 60, dev_shm=str(tmp_path))
    finally:
        torch.multiprocessing.set_sharing_strategy(strategy)


def test_an_engine_that_serialises_later_is_handed_a_state_dict_of_its_own():
    """checkpoint_save._handed_over_as_its_own: the engine's save gets new containers and tensor objects over the same
    storages (what it pickles later is what was there at the save, not stage 3's live objects, emptied again when the
    save returns), with each tensor's attributes (stage 3's masters carry ds_id) and Parameter-ness; a save the
    instance had of its own is back afterwards."""
    from tencache_ds.integrations.deepspeed.checkpoint_save import _handed_over_as_its_own
    master = torch.arange(4, dtype=torch.float32).requires_grad_()
    master.ds_id = 7
    weight = torch.nn.Parameter(torch.ones(2))
    state = {"fp32_flat_groups": [master], "optimizer_state_dict": {"state": {0: {"exp_avg": torch.zeros(3)}}},
             "shapes": ({"w": weight},)}
    handed = []

    def own_save(state_dict, path):  # set on the instance, as a user's wrapper would be
        handed.append(state_dict)

    engine = types.SimpleNamespace(save=own_save)
    with _handed_over_as_its_own(engine):
        engine.save(state, "zero.pt")
    assert engine.save is own_save
    [given] = handed
    master.data = torch.Tensor()  # what masters_shown does when the save returns
    state["optimizer_state_dict"]["state"][0]["exp_avg"] = torch.Tensor()  # ... and swapped_state_described
    kept = given["fp32_flat_groups"][0]
    assert kept is not master and kept.ds_id == 7 and kept.requires_grad and torch.equal(kept, torch.arange(4.0))
    assert given["optimizer_state_dict"]["state"][0]["exp_avg"].shape == (3,)
    assert isinstance(given["shapes"], tuple) and isinstance(given["shapes"][0]["w"], torch.nn.Parameter)
    assert given["shapes"][0]["w"].data_ptr() == weight.data_ptr()  # no bytes copied


def test_names_shared_with_a_checkpoint_leave_the_swap_folder_at_exit_only_in_the_process_that_trains(tmp_path):
    """optimizer_swapper._unshare_when_the_process_ends (a weakref.finalize handler): at exit an unclosed swapper's
    names still linked into a checkpoint are removed, those of other engines kept; a child forked from the training
    process inherits the handler and must leave them (its parent still trains on them); a closed swapper did it
    already."""
    from tencache_ds.integrations.deepspeed.optimizer_swapper import _unshare_when_the_process_ends
    folder, checkpoint = tmp_path / "rank0", tmp_path / "ckpt"
    folder.mkdir(), checkpoint.mkdir()
    for name in ("exp_avg-1_2.tensor.swp", "exp_avg-3_4.tensor.swp"):
        (folder / name).write_bytes(b"x")
        os.link(folder / name, checkpoint / name)
    (folder / "5_6.tensor.swp").write_bytes(b"y")  # not shared: stays
    swapper = types.SimpleNamespace(closed=False, files_folder=str(folder),
                                    owns_file=lambda name: "1_2" in name or "5_6" in name)
    ref = lambda: swapper  # noqa: E731  (what the weakref gives while the swapper lives)
    _unshare_when_the_process_ends(ref, os.getpid() + 1)  # a forked child's exit
    assert sorted(os.listdir(folder)) == ["5_6.tensor.swp", "exp_avg-1_2.tensor.swp", "exp_avg-3_4.tensor.swp"]
    _unshare_when_the_process_ends(ref, os.getpid())
    assert sorted(os.listdir(folder)) == ["5_6.tensor.swp", "exp_avg-3_4.tensor.swp"]  # the other engine's stays
    assert (checkpoint / "exp_avg-1_2.tensor.swp").read_bytes() == b"x"
    _unshare_when_the_process_ends(lambda: None, os.getpid())  # collected without close(): nothing known


def test_a_save_the_usual_way_settles_the_masters_the_writer_was_to_settle_and_reads_their_new_files(tmp_path,
                                                                                                    monkeypatch):
    """checkpoint_save.MasterSources: a master owed to its file is shown mapped from the file, behind until the ZeRO
    file's writer settles it. Where the two-pass save gives up (here: its structure cannot be walked), torch.save
    reads the mapped masters: they are settled first and mapped again (a settle may replace a linked file), so the
    file has the master's bits, not the stale file's (before, it would have saved the stale bytes)."""
    from tencache_ds.io import save_from_files
    path = str(tmp_path / "master.swp")
    stale, current = torch.zeros(10_000), torch.randn(10_000)
    stale.numpy().tofile(path)

    def settle_master_writes(groups=None, but=()):
        os.unlink(path)  # as make_own_file does to a file linked into a checkpoint: a new file
        current.numpy().tofile(path)
    swapper = types.SimpleNamespace(last_zero_file_save="untouched", checkpoint_totals=CheckpointTotals(),
                                    dtype=torch.float32, settle_master_writes=settle_master_writes)
    master = torch.from_file(path, shared=False, size=10_000, dtype=torch.float32)
    sources = MasterSources(swapper)
    sources.settled_by_the_writer(master, path, "g")
    monkeypatch.setattr(save_from_files, "save_from_files", lambda state_dict, path, sources: None)
    engine = TorchCheckpointEngine()
    zero_file = str(tmp_path / "tag" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with _saving_from_files(engine, sources, swapper):
        engine.save({"fp32_flat_groups": [master]}, zero_file)
    assert torch.equal(torch.load(zero_file, weights_only=False)["fp32_flat_groups"][0], current)


@pytest.mark.parametrize("block, shared", [(4096, True), (32 * 1024, True), (128 * 1024, False), (1 << 20, False)])
def test_blocks_larger_than_the_storages_alignment_are_not_shared(monkeypatch, tmp_path, block, shared):
    """Regression test (helper-157's review): a checkpoint folder that clones but reports blocks larger than the ZeRO
    file's storages can be aligned to (ZFS's 128 KiB records, an NFS server's 1 MiB wsize) was taken for one whose
    blocks the masters share: they were written to their swap files first and then copied (almost no storage starts
    on such a block), where written once from memory they cost half."""
    from tencache_ds.integrations.deepspeed import checkpoint_save
    monkeypatch.setattr(checkpoint_save, "block_size", lambda path: block)
    monkeypatch.setattr(checkpoint_save, "clones_between", lambda source, target: True)
    assert checkpoint_save._can_share_blocks(str(tmp_path), str(tmp_path / "tag")) is shared


def test_an_engine_whose_instance_has_its_own_save_is_saved_through_it():
    """Regression test (helper-202): a framework that sets its own ``save`` on the checkpoint engine (an upload, an
    integrity hash) was passed by: the save from the swap files replaced it, and the ZeRO file skipped the hook."""
    engine = TorchCheckpointEngine()
    engine.zipfile_serialization = True  # (the engine's default within DeepSpeed's config: zip files)
    assert _saves_from_files(engine) is save_from_files_supported()
    engine.save = lambda state_dict, path: None
    assert _saves_from_files(engine) is False


def save_from_files_supported() -> bool:
    from tencache_ds.io import save_from_files
    return bool(save_from_files.supported())
