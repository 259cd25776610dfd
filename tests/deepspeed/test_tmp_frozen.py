import pytest
from test_upstream_checkpoints import scenarios
pytestmark = [pytest.mark.deepspeed]
def test_x(tmp_path):
    name = "zero_to_fp32_frozen_params_offloaded"
    ref = scenarios(tmp_path, "stock", "cpu", [name])[name]
    ours = scenarios(tmp_path, "tencache", "nvme", [name])[name]
    assert ours.pop("placeholders_keep_weights") is True
    assert ours == ref, (ours, ref)
    assert ours["reloaded"] == ours["trained"] == ours["reloaded_weights_only"]
