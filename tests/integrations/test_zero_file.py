"""Whether a checkpoint's ZeRO file saved with the optimizer on cpu holds this engine's sub-groups and their bytes,
before its state is written into the swap files (integrations/deepspeed/zero_file.py ``_check_layout``,
``_check_bytes``), on tensors and lists only.
The load itself, in the real engine against the run that saved: tests/deepspeed/test_upstream_checkpoints.py
(``load_saved_on_cpu``)."""
import pytest
import torch

from tencache_ds.errors import TencacheError
from tencache_ds.integrations.deepspeed.zero_file import _check_bytes, _check_layout
from tencache_ds.integrations.deepspeed.swap_files import LOAD_REFUSED

SIZES = [1000, 24]  # this engine's sub-groups (elements), one parameter group


def saved(sizes, groups=None):
    """A ZeRO file's masters of ``sizes`` and its parameter groups (ids numbered as torch numbers them)."""
    groups = groups or [len(sizes)]
    ids = iter(range(len(sizes)))
    return [torch.zeros(size) for size in sizes], [{"params": [next(ids) for _ in range(count)]} for count in groups]


def check(sizes, groups=None):
    masters, saved_groups = saved(sizes, groups)
    _check_layout("zero.pt", masters, saved_groups, SIZES, [["a", "b"]])


def test_the_same_sub_groups_pass():
    check(SIZES)


@pytest.mark.parametrize("sizes, groups, why", [
    ([1024], None, "1 optimizer sub-groups, this engine 2"),
    (SIZES, [1, 1], "parameter groups of [1, 1] sub-groups, this engine's of [2]"),
    ([1000, 25], None, "sub-group 1 of 25 elements, this engine's of 24"),
], ids=["count", "groups", "size"])
def test_other_sub_groups_are_refused_naming_sub_group_size_before_anything_is_loaded(sizes, groups, why):
    with pytest.raises(TencacheError, match="sub_group_size") as error:
        check(sizes, groups)
    assert why in str(error.value) and LOAD_REFUSED in str(error.value)


@pytest.mark.parametrize("master, moment, why", [
    (torch.zeros(8), torch.empty(8, device="meta"), "optimizer state exp_avg without its bytes"),  # tencache's
    (torch.empty(0), torch.empty(0), "fp32 master, optimizer state exp_avg without its bytes"),  # stock NVMe's
], ids=["tencache-nvme", "stock-nvme"])
def test_a_checkpoint_of_the_optimizer_on_nvme_without_its_swap_files_is_refused_naming_where_they_were_looked_for(
        master, moment, why):
    with pytest.raises(TencacheError, match="saved with the optimizer on NVMe") as error:
        _check_bytes("zero.pt", "ckpt/tag/offloaded_tensors/rank00", [master], [{"step": 2, "exp_avg": moment}])
    assert why in str(error.value) and "offloaded_tensors/rank00" in str(error.value)


def test_a_checkpoint_of_the_optimizer_on_cpu_has_every_byte():
    _check_bytes("zero.pt", "nowhere", [torch.zeros(8)], [{"step": 2, "exp_avg": torch.zeros(8)}])
