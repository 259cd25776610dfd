"""The profile file (config "profile_path"). Owns: its JSON format, fingerprints, atomic replacement, staleness.

One file holds one section per recorder ("params", "optimizer"); each section carries the fingerprint of what it
describes (tensor sizes, dtype, world size), so a profile recorded for another model or config is recognised as
stale, reported, and replaced after the new run's first step, never used.

    {"version": 1, "sections": {"params": {"fingerprint": "9f2c...", "order": [12, 13, ...], "recorded_unix": ...}}}
"""
import hashlib
import json
import os
import tempfile
import threading
import time
from typing import Hashable, List, Optional

from ..log import logger

PROFILE_VERSION = 1
_lock = threading.Lock()


def fingerprint(*facts) -> str:
    """A stable hash of JSON-able facts, e.g. fingerprint(sorted(numel by key), "bfloat16", world_size)."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_section(path: str, section: str, expected_fingerprint: str) -> Optional[List[Hashable]]:
    """The order saved in ``section`` if the file has one recorded for ``expected_fingerprint``; else None, with
    a warning that says why (missing file: silent)."""
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as handle:
            data = json.load(handle)
        entry = data["sections"][section]
        if data.get("version") != PROFILE_VERSION:
            raise ValueError(f"profile version {data.get('version')} (this tencache writes {PROFILE_VERSION})")
    except KeyError:
        return None
    except (OSError, ValueError, TypeError) as err:
        logger.warning("profile %s is unreadable (%s): re-profiling; it will be replaced after the first step",
                       path, err)
        return None
    if entry.get("fingerprint") != expected_fingerprint:
        logger.warning("profile %s [%s] is stale: it was recorded for another model or config (fingerprint %s, this "
                       "run %s); re-profiling, it will be replaced after the first step", path, section,
                       entry.get("fingerprint"), expected_fingerprint)
        return None
    return entry["order"]


def save_section(path: str, section: str, section_fingerprint: str, order: List[Hashable]) -> None:
    """Replace ``section`` in the profile file atomically (write a temporary file, then rename)."""
    if not path:
        return
    with _lock:
        data = {"version": PROFILE_VERSION, "sections": {}}
        try:
            with open(path) as handle:
                existing = json.load(handle)
            if existing.get("version") == PROFILE_VERSION:
                data["sections"] = dict(existing.get("sections", {}))
        except (OSError, ValueError):
            pass
        data["sections"][section] = {"fingerprint": section_fingerprint, "order": order,
                                     "recorded_unix": time.time()}
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=".profile-")
        with os.fdopen(descriptor, "w") as handle:
            json.dump(data, handle)
        os.replace(temporary, path)
