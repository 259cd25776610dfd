"""A torch.save file whose large tensors share blocks with the files that hold their bytes (io/cloned_save.py), on
real files: it reads back as torch.save's own would, storage for storage (views and shared storages included); on an
XFS image the masters' blocks are shared and only the rest is written, and training's later writes to the swap files
leave it alone; where nothing clones, every byte is written; a structure it cannot walk is refused, never half
saved."""
import os

import pytest
import torch

from tencache_ds.io.cloned_save import save_sharing
from tencache_ds.io.reflink import block_size

MASTER_ELEMENTS = 1_000_003  # not a whole number of blocks: the tail is written


class Holder:
    """An object whose tensors are plain attributes (DeepSpeed's state dicts hold a few: the loss scaler)."""

    def __init__(self, tensor):
        self.tensor = tensor


class Hidden:
    """An object that pickles its tensor through __reduce__: nothing a walk of attributes can find."""

    def __init__(self, tensor):
        self._payload = [tensor]

    def __reduce__(self):
        return Hidden, (self._payload[0],)

    def __getattribute__(self, name):
        if name == "__dict__":
            return {}
        return object.__getattribute__(self, name)


def swap_file(folder, tensor) -> torch.Tensor:
    """``tensor``'s bytes in a file of their own (padded, as swap files are), shown as a tensor mapped from it."""
    path = os.path.join(folder, f"master-{tensor.numel()}.swp")
    with open(path, "wb") as handle:
        handle.write(tensor.numpy().tobytes() + b"\0" * 3000)
    return torch.from_file(path, shared=False, size=tensor.numel(), dtype=tensor.dtype), path


def zero_state(folder):
    """A ZeRO file's shape: masters mapped from swap files, empty placeholders, moments described on the meta device
    (checkpoint_save.swapped_state_described: no record), views, bf16, scalars, an object."""
    generator = torch.Generator().manual_seed(0)
    masters = [torch.randn(MASTER_ELEMENTS, generator=generator), torch.randn(4096, generator=generator)]
    shown = [swap_file(folder, master) for master in masters]
    base = torch.arange(100, dtype=torch.float32)
    state = {"optimizer_state_dict": {"state": {0: {"exp_avg": torch.empty(0), "step": torch.tensor(3),
                                                            "exp_avg_sq": torch.empty(MASTER_ELEMENTS, device="meta")}},
                                      "param_groups": [{"lr": 1e-3, "params": [0]}],
                                      "fp32_flat_groups": [tensor for tensor, _ in shown],
                                      "bf16": torch.ones(7, dtype=torch.bfloat16), "view": base[5:], "base": base,
                                      "holder": Holder(base[10:20])},
             "ds_version": "0.19.8"}
    sources = {tensor.untyped_storage().data_ptr(): path for tensor, path in shown}
    return state, masters, sources


def assert_reads_back(path, state, masters):
    loaded = torch.load(path, weights_only=False)["optimizer_state_dict"]
    saved = state["optimizer_state_dict"]
    for ours, master in zip(loaded["fp32_flat_groups"], masters):
        assert torch.equal(ours.view(torch.int32), master.view(torch.int32))
    for key in ("bf16", "view", "base"):
        assert torch.equal(loaded[key], saved[key]), key
    assert torch.equal(loaded["holder"].tensor, saved["holder"].tensor)
    assert loaded["state"][0]["step"].item() == 3 and loaded["state"][0]["exp_avg"].numel() == 0
    assert loaded["state"][0]["exp_avg_sq"].is_meta and loaded["state"][0]["exp_avg_sq"].numel() == MASTER_ELEMENTS
    assert loaded["view"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()


def test_on_a_file_system_that_clones_the_masters_blocks_are_shared_and_survive_later_writes(reflink_folder):
    folder = os.path.join(reflink_folder, "cloned-save")
    os.makedirs(folder, exist_ok=True)
    state, masters, sources = zero_state(folder)
    path = os.path.join(folder, "zero.pt")
    done = save_sharing(state, path, sources)
    block = block_size(folder)
    assert done.records == 6  # the empty placeholder, the step, two masters, bf16, and the base of every view
    assert done.cloned_bytes == (MASTER_ELEMENTS * 4 // block + 4096 * 4 // block) * block
    assert done.written_bytes < 2 * block + 1000  # the first master's tail and the small tensors
    assert_reads_back(path, state, masters)
    for source in sources.values():  # the next steps write the swap files again
        with open(source, "r+b") as handle:
            handle.write(b"\xff" * os.path.getsize(source))
    assert_reads_back(path, state, masters)


def test_where_nothing_clones_every_byte_is_written(tmp_path):
    state, masters, sources = zero_state(str(tmp_path))
    done = save_sharing(state, str(tmp_path / "zero.pt"), sources)
    if done.cloned_bytes:
        pytest.skip("the test folder's file system clones ranges")
    assert done.written_bytes == sum(master.numel() * 4 for master in masters) + 7 * 2 + 100 * 4 + 8
    assert_reads_back(str(tmp_path / "zero.pt"), state, masters)


class Swapped:
    """An object whose pickled state is not its attributes: its two same-size tensors change places."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __getstate__(self):
        return {"first": self.second, "second": self.first}


@pytest.mark.parametrize("hidden", [Hidden(torch.ones(3)), Swapped(torch.zeros(4), torch.ones(4))],
                         ids=["reduce", "getstate"])
def test_a_structure_that_cannot_be_walked_is_refused_and_nothing_is_left(tmp_path, hidden):
    state, _masters, sources = zero_state(str(tmp_path))
    state["optimizer_state_dict"]["hidden"] = hidden
    assert save_sharing(state, str(tmp_path / "zero.pt"), sources) is None
    assert not [name for name in os.listdir(tmp_path) if name.endswith((".pt", ".sharing"))]


def test_a_save_that_fails_half_way_leaves_the_file_it_replaces(tmp_path):
    """The file is renamed over ``path`` only when every storage is in it: a source that cannot be read stops the
    save, and the checkpoint saved before is still whole, with no temporary file beside it."""
    state, masters, sources = zero_state(str(tmp_path))
    path = str(tmp_path / "zero.pt")
    assert save_sharing(state, path, sources) is not None
    os.unlink(next(iter(sources.values())))  # the first master's swap file is gone
    with pytest.raises(FileNotFoundError):
        save_sharing(state, path, sources)
    assert_reads_back(path, state, masters)
    assert sorted(name for name in os.listdir(tmp_path) if not name.endswith(".swp")) == ["zero.pt"]


def test_a_temporary_file_left_by_a_killed_save_is_removed_by_the_next_save(tmp_path):
    """A save killed between its first pass and its rename leaves ``.<name>.<pid>.sharing`` (never a name a loader
    opens), whose shared blocks would keep old masters on the drive: the next sharing save into the same checkpoint
    directory removes it, in its own tag's folder or another's, once that process is gone; a live process's stays,
    and so do files that only look alike."""
    import subprocess
    import sys
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tag, other_tag = tmp_path / "global_step2", tmp_path / "global_step1"
        tag.mkdir()
        other_tag.mkdir()
        state, masters, sources = zero_state(str(tmp_path))
        left = tag / f".zero.pt.{killed.pid}.sharing"
        left_in_other_tag = other_tag / f".zero_pp_rank_1_optim_states.pt.{killed.pid}.sharing"
        live = tag / f".zero.pt.{running.pid}.sharing"  # a save in progress in another process
        alike = [tag / f"zero.pt.{killed.pid}.sharing", tag / ".zero.pt.sharing", tag / f".{killed.pid}.sharing"]
        for path in (left, left_in_other_tag, live, *alike):
            path.write_bytes(b"\0" * 4096)
        assert save_sharing(state, str(tag / "zero.pt"), sources) is not None
        assert not left.exists() and not left_in_other_tag.exists()
        assert live.exists() and all(path.exists() for path in alike)
        assert_reads_back(str(tag / "zero.pt"), state, masters)
    finally:
        running.kill()
        running.wait()
