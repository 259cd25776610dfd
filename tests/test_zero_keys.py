"""DeepSpeed's ZeRO keys as zero_sections.py pins them (``deepspeed_refusal``: what `tencache-ds estimate` and
`doctor` say deepspeed.initialize will stop on, without importing DeepSpeed): the pinned sets are the installed
DeepSpeed's own models' fields and aliases, every config the repository ships passes, and a misspelt key, a device
written in another case and an NVMe offload without a folder are named (helper-244's review: "fits: yes" and
"OK config" for each, a misspelt sub_group_size priced at DeepSpeed's default)."""
import glob
import json
import os

import pytest

from tencache_ds.zero_sections import OFFLOAD_KEYS, ZERO_KEYS, deepspeed_refusal

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _names(model) -> frozenset:
    return frozenset(name for field_name, field in model.model_fields.items()
                     for name in (field_name, field.alias) if name)


def test_the_pinned_keys_are_the_installed_deepspeeds():
    zero_config = pytest.importorskip("deepspeed.runtime.zero.config")
    offload_config = pytest.importorskip("deepspeed.runtime.zero.offload_config")
    assert ZERO_KEYS == _names(zero_config.DeepSpeedZeroConfig)
    assert OFFLOAD_KEYS["offload_param"] == _names(offload_config.DeepSpeedZeroOffloadParamConfig)
    assert OFFLOAD_KEYS["offload_optimizer"] == _names(offload_config.DeepSpeedZeroOffloadOptimizerConfig)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "configs", "*.json"))))
def test_the_shipped_configs_pass(path):
    with open(path) as handle:
        assert deepspeed_refusal(json.load(handle)) is None


def _config(**edits):
    with open(os.path.join(REPO, "configs", "stock-nvme-many-sub-groups.json")) as handle:
        config = json.load(handle)
    for dotted, value in edits.items():
        *parents, key = dotted.split(".")
        section = config
        for parent in parents:
            section = section[parent]
        if value is None:
            del section[key]
        else:
            section[key] = value
    return config


def test_what_deepspeed_stops_on_is_named():
    typo = _config(**{"zero_optimization.sub_group_size": None, "zero_optimization.sub_group_sise": 2000000})
    assert deepspeed_refusal(typo) == ("zero_optimization.sub_group_sise is not a key of DeepSpeed's (did you mean "
                                       "sub_group_size?): DeepSpeed refuses the config")
    stray = _config(**{"zero_optimization.offload_param.buffer_sizes": 4})
    assert "zero_optimization.offload_param.buffer_sizes is not a key" in deepspeed_refusal(stray)
    cased = _config(**{"zero_optimization.offload_optimizer.device": "NVMe"})
    assert deepspeed_refusal(cased).startswith("zero_optimization.offload_optimizer.device is 'NVMe'")
    no_folder = _config(**{"zero_optimization.offload_param.nvme_path": None})
    assert deepspeed_refusal(no_folder).startswith("zero_optimization.offload_param.nvme_path is missing")
    null_device = _config(**{"zero_optimization.offload_param.device": "x"})
    null_device["zero_optimization"]["offload_param"]["device"] = None  # (pydantic refuses null for the enum)
    assert deepspeed_refusal(null_device).startswith("zero_optimization.offload_param.device is None")
    # aliases pass (DeepSpeed's models take both names), and a "tencache" block inside is reject_nested_blocks'
    aliased = _config(**{"zero_optimization.stage3_prefetch_bucket_size": 1e6, "zero_optimization.tencache": {}})
    assert deepspeed_refusal(aliased) is None
    # what DeepSpeed takes (helper-245's review): a key valued "auto" (its models drop it, so a device "auto" is
    # none), an empty nvme_path (the working directory), and an NVMe offload without a folder below stage 3 (stages
    # 1 and 2 offload to cpu whatever the device)
    auto = _config(**{"zero_optimization.anything": "auto", "zero_optimization.offload_param.device": "auto"})
    empty = _config(**{"zero_optimization.offload_param.nvme_path": ""})
    stage_2 = _config(**{"zero_optimization.stage": 2, "zero_optimization.offload_param.nvme_path": None})
    assert [deepspeed_refusal(config) for config in (auto, empty, stage_2)] == [None] * 3
