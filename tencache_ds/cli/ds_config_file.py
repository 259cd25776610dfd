"""A DeepSpeed config named on the command line (`doctor --config`, `bench --config`, `estimate --ds-config`), read
the way ``deepspeed.initialize`` reads one: a path to a JSON or HJSON file (comments and unquoted keys allowed,
duplicate keys refused), else base64 text of one (``bench`` takes files only: each run reads the file again). Owns:
that reading for the CLI, and its error messages, which name the file or the text. Does not own: the forms a
running engine gets its config in (integrations/deepspeed/config_source.py, which calls DeepSpeed's own reader;
tests/cli/test_ds_config_file.py checks that both read the same inputs alike).

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


class _DuplicateKeys(ValueError):
    pass


def _refuse_duplicate_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """Build an object, refusing a key given twice (DeepSpeed's reader does, for files: the second value would
    silently win). Base64 text is held to the same rule, which DeepSpeed does not check there."""
    counts = collections.Counter(key for key, _value in pairs)
    repeated = sorted(key for key, count in counts.items() if count > 1)
    if repeated:
        raise _DuplicateKeys(f"duplicate keys {repeated}")
    return dict(pairs)


def read_ds_config(config: str) -> Dict[str, Any]:
    """The dict of the DeepSpeed config ``config`` (a path, else base64 text).

    Raises:
        TencacheConfigError: unreadable, neither a file nor base64, not JSON/HJSON, duplicate keys, or not an
            object (the message names the file, or quotes the text).
    """
    if os.path.exists(config):
        what = f"the DeepSpeed config {config}"
        try:
            with open(config, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as err:
            raise TencacheConfigError(f"cannot read {what}: {err.strerror or err}") from None
        except UnicodeDecodeError as err:
            raise TencacheConfigError(f"{what} is not UTF-8 text: {err}") from None
    else:
        missing = TencacheConfigError(f"the DeepSpeed config {config} does not exist (and is not base64 text of "
                                      "one either)")
        shown = config if len(config) <= 80 else config[:77] + "..."
        what = f"the DeepSpeed config given as base64 text {shown!r}"
        try:
            text = base64.urlsafe_b64decode(config).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise missing from None
        if os.sep in config or config.endswith((".json", ".hjson")):
            # meant as a path that happens to decode: a missing file is what the user needs to hear of
            try:
                return _parse(text, what)
            except TencacheConfigError:
                raise missing from None
    return _parse(text, what)


def _parse(text: str, what: str) -> Dict[str, Any]:
    try:
        value = _parser.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except _DuplicateKeys as err:
        raise TencacheConfigError(f"{what} has {err}: DeepSpeed refuses them") from None
    except ValueError as err:  # json's and hjson's decode errors are ValueErrors
        raise TencacheConfigError(f"{what} is not valid JSON or HJSON: {err}") from None
    if not isinstance(value, dict):
        raise TencacheConfigError(f"{what} holds a {type(value).__name__}, not an object")
    return value
