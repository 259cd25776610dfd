"""The optimizer swap files' names (integrations/deepspeed/swap_files.py SWAP_FILE_NAME), which decide
what a load without the optimizer's state places (the masters only) and what a rebuilt engine adopts: the master's,
every optimizer's state names (a client optimizer's too), and the gradient files, which are neither."""
import pytest

from tencache_ds.integrations.deepspeed.swap_files import SWAP_FILE_NAME, swap_file_name


@pytest.mark.parametrize("name, state, sub_group", [
    ("0_27.tensor.swp", None, "0_27"),                           # the fp32 master
    ("exp_avg-0_27.tensor.swp", "exp_avg", "0_27"),              # Adam, Lion
    ("exp_avg_sq-12_40.tensor.swp", "exp_avg_sq", "12_40"),      # Adam, Adagrad
    ("momentum_buffer-3_9.tensor.swp", "momentum_buffer", "3_9"),  # Muon
    ("m2-3_9.tensor.swp", "m2", "3_9"),                          # a client optimizer's state key with a digit
    ("ema-decay-3_9.tensor.swp", "ema-decay", "3_9"),            # ... or a dash
])
def test_masters_and_state_files(name, state, sub_group):
    match = SWAP_FILE_NAME.match(name)
    assert match is not None and (match["state"], match["id"]) == (state, sub_group)
    assert swap_file_name(sub_group, state) == name  # the one format, both ways


@pytest.mark.parametrize("name", ["0_27_gradient_0_1024.tensor.swp", "0_27.tensor.swp.tmp", ".0_27.tensor.swp.1.sharing",
                                  "27.tensor.swp"])
def test_other_files_are_neither(name):
    assert SWAP_FILE_NAME.match(name) is None
