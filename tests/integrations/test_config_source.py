"""The one reader of the "tencache" block (integrations/deepspeed/config_source.py): every form DeepSpeed takes a
config in gives the same block, and every caller (the config check at deepspeed.initialize, the param swapper, the
refusal after a failed install) reads it there."""
import argparse
import base64
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("deepspeed")
from tencache_ds.config import TencacheConfig  # noqa: E402
from tencache_ds.errors import TencacheConfigError  # noqa: E402
from tencache_ds.integrations.deepspeed.config_source import ds_config_dict, tencache_config  # noqa: E402
from tencache_ds.integrations.deepspeed.config_source import ds_config_of_initialize_call  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = {"train_batch_size": 1, "tencache": {"host_cache_bytes": "64MiB"}}


class DeepSpeedConfigLike:
    """What zero.Init hands the param swapper: DeepSpeed's parsed sections drop the block; the user dict keeps it."""
    _param_dict = CONFIG


def test_every_form_of_a_config_gives_the_same_block(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(CONFIG))
    hjson_path = tmp_path / "ds.hjson"
    hjson_path.write_text("{\n  train_batch_size: 1\n  tencache: {\n    host_cache_bytes: 64MiB\n  }\n}\n")
    encoded = base64.urlsafe_b64encode(json.dumps(CONFIG).encode()).decode()
    for form in (CONFIG, DeepSpeedConfigLike(), str(path), str(hjson_path), encoded):
        assert ds_config_dict(form) == CONFIG, form
        assert tencache_config(form).host_cache_bytes == 64 << 20, form


def test_no_config_or_an_unreadable_one_is_no_block(tmp_path):
    """DeepSpeed raises its own error for a config it cannot read; the reader only says "no block"."""
    for form in (None, 3, [CONFIG], str(tmp_path / "missing.json"), "not base64 {"):
        assert ds_config_dict(form) is None, form
        assert tencache_config(form) == TencacheConfig(enabled=False), form


def test_an_invalid_block_names_its_key_whatever_the_form():
    with pytest.raises(TencacheConfigError, match="tencache.host_cach: unknown key"):
        tencache_config(type("Config", (), {"_param_dict": {"tencache": {"host_cach": 0}}})())


def test_the_initialize_call_uses_the_config_deepspeed_uses(tmp_path):
    """config, else config_params, else args.deepspeed_config, else args.deepscale_config (DeepSpeed's order)."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"from": "path"}))
    args = argparse.Namespace(deepspeed_config=str(path))
    assert ds_config_of_initialize_call({"config": {"from": "config"}, "config_params": {"from": "params"},
                                         "args": args}) == {"from": "config"}
    assert ds_config_of_initialize_call({"config_params": {"from": "params"}, "args": args}) == {"from": "params"}
    assert ds_config_of_initialize_call({"args": args}) == {"from": "path"}
    assert ds_config_of_initialize_call({"args": argparse.Namespace(deepscale_config=str(path))}) == {"from": "path"}
    assert ds_config_of_initialize_call({"args": argparse.Namespace()}) is None


@pytest.mark.parametrize("how", ["base64", "positional"])
def test_a_failed_install_refuses_a_config_in_any_form_deepspeed_reads(how):
    """refusal.py reads the call's config with the same reader: a tencache config given as base64 (which DeepSpeed
    reads) or as the positional ``config`` argument is refused too, not trained stock."""
    config = {"train_batch_size": 1, "tencache": {}}
    if how == "base64":
        encoded = base64.urlsafe_b64encode(json.dumps(config).encode()).decode()
        call = f"deepspeed.initialize(model=torch.nn.Linear(2, 2), config={encoded!r})"
    else:  # args, model, optimizer, model_parameters, training_data, lr_scheduler, port, mpu, dist_init, collate
        call = f"deepspeed.initialize(None, torch.nn.Linear(2, 2), *[None] * 4, 29500, None, None, None, {config!r})"
    code = ("import sys; sys.modules['tencache_ds.integrations.deepspeed.install'] = None; "
            "import tencache_ds, deepspeed, torch\n"
            "try:\n"
            f"    {call}\n"
            "except tencache_ds.TencacheError as err:\n"
            "    print('REFUSED', 'could not install' in str(err))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert "REFUSED True" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
