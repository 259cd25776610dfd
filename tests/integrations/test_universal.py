"""A universal checkpoint loaded with the optimizer on NVMe (integrations/deepspeed/universal.py): every parameter's
files are checked before anything is set (``_checked``), on real folders and an object with only what the check
reads. The load itself, in the real engine against stock CPU offload: tests/deepspeed/test_upstream_checkpoints.py
(``load_at_other_world_size``)."""
import types

import pytest
import torch

from tencache_ds.errors import TencacheError
from tencache_ds.integrations.deepspeed.universal import STATE_KEYS, _checked

KEYS = ("fp32",) + STATE_KEYS


def universal(tmp_path, names, missing=()):
    """A universal checkpoint's ``zero`` folder with a file of each key per parameter name, but ``missing``."""
    for name in names:
        (tmp_path / "zero" / name).mkdir(parents=True)
        for key in KEYS:
            if f"{name}/{key}" not in missing:
                torch.save({"param": torch.zeros(4)}, tmp_path / "zero" / name / f"{key}.pt")
    return tmp_path


def optimizer(names):
    params = [object() for _ in names]
    return types.SimpleNamespace(fp16_groups=[params[:1], params[1:]], param_names=dict(zip(params, names)))


def test_a_complete_checkpoint_passes(tmp_path):
    folder = universal(tmp_path, ["a.weight", "a.bias"])
    assert _checked(optimizer(["a.weight", "a.bias"]), str(folder), KEYS) == str(folder / "zero")


def test_a_missing_file_is_found_before_anything_is_set(tmp_path):
    folder = universal(tmp_path, ["a.weight", "a.bias"], missing={"a.bias/exp_avg_sq"})
    with pytest.raises(TencacheError, match="a.bias/exp_avg_sq.pt does not exist .*No swap file was placed"):
        _checked(optimizer(["a.weight", "a.bias"]), str(folder), KEYS)
    _checked(optimizer(["a.weight", "a.bias"]), str(folder), ("fp32",))  # the weights alone are all there


def test_a_parameter_without_a_name_or_a_folder_that_is_not_universal_is_refused(tmp_path):
    folder = universal(tmp_path, ["a.weight"])
    unnamed = optimizer(["a.weight", "b.weight"])
    unnamed.param_names.popitem()
    with pytest.raises(TencacheError, match="sub-group 1 has no name"):
        _checked(unnamed, str(folder), KEYS)
    with pytest.raises(TencacheError, match="ds_to_universal's output"):
        _checked(optimizer([]), str(tmp_path / "elsewhere"), KEYS)


def test_moments_without_bytes_are_refused_with_the_command_that_gives_them_bytes(tmp_path):
    """ds_to_universal of a tencache checkpoint of the optimizer on NVMe that was not converted first."""
    folder = universal(tmp_path, ["a.weight", "a.bias"])
    torch.save({"param": torch.empty(4, device="meta")}, folder / "zero" / "a.bias" / "exp_avg.pt")
    with pytest.raises(TencacheError, match="a.bias/exp_avg.pt holds no bytes.*checkpoint-for-cpu"):
        _checked(optimizer(["a.weight", "a.bias"]), str(folder), KEYS)
