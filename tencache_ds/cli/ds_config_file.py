"""A DeepSpeed config named on the command line (`doctor --config`, `bench --config`, `estimate --ds-config`), read
the way ``deepspeed.initialize`` reads one: a path to a JSON or HJSON file (comments and unquoted keys allowed,
duplicate keys refused), else a base64 string of one. Owns: that reading for the CLI, and its error messages, which
name the path. Does not own: the forms a running engine gets its config in (integrations/deepspeed/config_source.py,
which calls DeepSpeed's own reader; tests/cli/test_ds_config_file.py checks that both read the same inputs alike).

DeepSpeed is not imported: the CLI's parent processes never import torch or DeepSpeed (doctor reports a broken
install instead of dying of it). ``hjson`` is DeepSpeed's own dependency; without it, plain JSON is read.
"""
import base64
import binascii
import collections
import json
import os
from typing import Any, Dict, List, Tuple

from ..errors import TencacheConfigError

try:
    import hjson as _parser
except ImportError:  # DeepSpeed is not installed: doctor says so; JSON is what its configs nearly always are
    _parser = json


def _refuse_duplicate_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """Build an object, refusing a key given twice (DeepSpeed's reader does: the second value would silently win)."""
    counts = collections.Counter(key for key, _value in pairs)
    repeated = sorted(key for key, count in counts.items() if count > 1)
    if repeated:
        raise ValueError(f"duplicate keys {repeated}")
    return dict(pairs)


def read_ds_config(config: str) -> Dict[str, Any]:
    """The dict of the DeepSpeed config ``config`` (a path, else base64 text).

    Raises:
        TencacheConfigError: unreadable, not JSON/HJSON, duplicate keys, or not an object (the message names it).
    """
    if os.path.exists(config):
        what = f"the DeepSpeed config {config}"
        try:
            with open(config) as handle:
                text = handle.read()
        except OSError as err:
            raise TencacheConfigError(f"cannot read {what}: {err.strerror or err}") from None
    elif os.sep in config or config.endswith((".json", ".hjson")):  # meant as a path: say so, not "not base64"
        raise TencacheConfigError(f"the DeepSpeed config {config} does not exist")
    else:
        what = "the DeepSpeed config given as base64"
        try:
            text = base64.urlsafe_b64decode(config).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise TencacheConfigError(f"the DeepSpeed config {config!r} is neither an existing file nor base64 "
                                      "text") from None
    try:
        value = _parser.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except ValueError as err:  # json's and hjson's decode errors are ValueErrors
        raise TencacheConfigError(f"{what} is not valid JSON or HJSON: {err}") from None
    if not isinstance(value, dict):
        raise TencacheConfigError(f"{what} holds a {type(value).__name__}, not an object")
    return value
