"""The CLI reads a DeepSpeed config as ``deepspeed.initialize`` does (cli/ds_config_file.py): the same dict for the
same JSON, HJSON or base64 input, refusals where DeepSpeed refuses, and messages that name the file."""
import base64
import json
import subprocess
import sys

import pytest

from tencache_ds.cli.ds_config_file import read_ds_config
from tencache_ds.errors import TencacheConfigError

HJSON_CONFIG = """
# a comment, as DeepSpeed's HJSON reader allows
{
  train_micro_batch_size_per_gpu: 2
  zero_optimization: {stage: 3, offload_param: {device: "nvme", nvme_path: "/tmp/x"}}
  tencache: {host_cache_bytes: "auto"}  // another comment
}
"""
JSON_CONFIG = json.dumps({"zero_optimization": {"stage": 3}, "tencache": {"enabled": True}})
SLASHED_BASE64 = base64.b64encode(json.dumps({"zero_optimization": {"stage": 3}, "note": "???"}).encode()).decode()
assert "/" in SLASHED_BASE64
DUPLICATE_KEYS = '{"zero_optimization": {"stage": 3}, "zero_optimization": {"stage": 2}}'


def deepspeeds_reading(inputs):
    """DeepSpeed's own reader (the one integrations/deepspeed/config_source.py calls) on each input, in a process of
    its own (this one never imports DeepSpeed): the dict, or "refused"."""
    code = ("import json, sys\n"
            "from deepspeed.runtime.tensor_parallel.init_utils import load_ds_config\n"
            "out = []\n"
            "for item in json.loads(sys.argv[1]):\n"
            "    try:\n"
            "        out.append(load_ds_config(item))\n"
            "    except Exception:\n"
            "        out.append('refused')\n"
            "print('RESULT ' + json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(inputs)], capture_output=True, text=True,
                          timeout=300, check=True)
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def ours(item):
    try:
        return read_ds_config(item)
    except TencacheConfigError:
        return "refused"


def test_the_cli_reads_a_config_as_deepspeed_does(tmp_path):
    files = {"hjson": HJSON_CONFIG, "json": JSON_CONFIG, "duplicates": DUPLICATE_KEYS, "broken": "{stage: [",
             "list": "[1, 2]"}
    inputs = []
    for name, text in files.items():
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        inputs.append(str(path))
    inputs.append(base64.urlsafe_b64encode(JSON_CONFIG.encode()).decode())
    inputs.append(str(tmp_path / "missing.json"))  # neither a file nor base64
    inputs.append("no-such-config")
    inputs.append(SLASHED_BASE64)  # standard base64 with a "/": DeepSpeed decodes it, it names no file
    theirs = deepspeeds_reading(inputs)
    mine = [ours(item) for item in inputs]
    # DeepSpeed's reader returns a list from a file holding one (initialize refuses it later); ours refuses it
    # at once, naming the file
    assert theirs[4] == [1, 2] and mine[4] == "refused"
    del theirs[4], mine[4]
    assert mine == theirs
    assert mine[0]["tencache"] == {"host_cache_bytes": "auto"} and mine[0]["train_micro_batch_size_per_gpu"] == 2
    assert mine[2] == mine[3] == mine[5] == mine[6] == "refused" and mine[4] == mine[1] == json.loads(JSON_CONFIG)
    assert mine[7] == {"zero_optimization": {"stage": 3}, "note": "???"}


def test_a_file_that_is_not_text_is_named(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(TencacheConfigError, match=f"the DeepSpeed config {path} is not UTF-8 text"):
        read_ds_config(str(path))


def test_a_missing_file_is_named_as_missing(tmp_path):
    with pytest.raises(TencacheConfigError, match=f"the DeepSpeed config {tmp_path}/ds.json does not exist"):
        read_ds_config(str(tmp_path / "ds.json"))


@pytest.mark.parametrize("text, words", [
    (DUPLICATE_KEYS, "duplicate keys ['zero_optimization']"),
    ("{stage: [", "is not valid JSON or HJSON"),
    ("[1, 2]", "holds a list, not an object"),
])
def test_a_config_that_cannot_be_used_is_refused_naming_the_file(tmp_path, text, words):
    path = tmp_path / "ds_config.json"
    path.write_text(text)
    with pytest.raises(TencacheConfigError) as refused:
        read_ds_config(str(path))
    assert str(path) in str(refused.value) and words in str(refused.value)
