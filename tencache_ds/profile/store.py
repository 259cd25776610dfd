"""The profile file (config "profile_path"). Owns: its JSON format, fingerprints, atomic replacement, staleness.

One file holds one section per store ("params", "optimizer"; "optimizer-2" and on for the optimizers of engines
trained at once in one process: ``section_kind``); each section is one step (profile/step_profile.py)
and the fingerprint of what it describes (tensor sizes, dtype, world size, the config facts that change the
access sequence), so a profile recorded for another model or config is recognised as stale, reported, and
replaced once the new run has recorded its own, never used. ``facts`` repeats the readable part of what was
fingerprinted, for `tencache-ds profile show`.

    {"version": 2, "sections": {"params": {"fingerprint": "9f2c...", "recorded_unix": 1.7e9, "facts": {...},
                                           "step": {"keys": [12, 13, ...], "nbytes": [...], "offset_s": [...],
                                                    "read_s": [...], "stall_s": [...], "step_s": 0.41},
                                           "steady": {"steps": 5, "step_s": 0.30, ...}}}}

"steady" (profile/steady.py) summarises the steps that repeated the recorded one; a section has none until a step
repeated it (and none in files of an older tencache, which read as before).

Version 1 files (order only, no timings) are reported and re-recorded, never read.
"""
import contextlib
import dataclasses
import datetime
import glob
import hashlib
import json
import os
import re
import stat
import tempfile
import threading
import time
from typing import Dict, List, Optional

from ..log import logger
from ..units import finite
from .steady import SteadyTimings
from .step_profile import StepProfile

PROFILE_VERSION = 2
_lock = threading.Lock()


def section_kind(section: str) -> str:
    """What store a section profiles: "optimizer" for "optimizer-2", "optimizer-3", ... (the optimizers of engines
    alive at once in one process, each with its own section); the name itself otherwise."""
    kind, dash, ordinal = section.rpartition("-")
    return kind if dash and ordinal.isdigit() else section


@dataclasses.dataclass(frozen=True)
class SavedSection:
    step: StepProfile
    fingerprint: str
    facts: dict
    recorded_unix: Optional[float]
    steady: Optional[SteadyTimings] = None


def fingerprint(*facts) -> str:
    """A stable hash of JSON-able facts, e.g. fingerprint(sorted(numel by key), {"dtype": "bfloat16", ...})."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_sections(path: str, skip_damaged: bool = False) -> Dict[str, SavedSection]:
    """Every section of the file. Raises OSError if it cannot be read, ValueError if it is not a version-2 profile
    or a section is malformed (the message names the section and says why). ``skip_damaged``: a malformed section
    is left out instead, with a warning, and the others are returned (a training run re-profiles only what it
    cannot use: ``load_section``)."""
    try:
        handle = open(path)
    except FileNotFoundError as err:
        ranks = rank_files(path)
        if ranks:  # (a multi-rank run's: the name itself is never written)
            raise FileNotFoundError(err.errno, f"{err.strerror}; a multi-rank run writes one file per rank, "
                                    f"and these exist: {', '.join(ranks)}", path) from None
        raise
    with handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        raise ValueError("not a profile (the top level is not an object)")
    if "version" not in data:  # (another JSON file: a run's result, a DeepSpeed config; helper-244)
        raise ValueError("not a tencache profile (no \"version\" key)")
    if data.get("version") != PROFILE_VERSION:
        raise ValueError(f"profile format version {data.get('version')} (this tencache reads {PROFILE_VERSION})")
    sections = data.get("sections")
    if not isinstance(sections, dict):
        raise ValueError("no \"sections\" object")
    readable = {}
    for name, entry in sections.items():
        try:
            readable[name] = SavedSection(StepProfile.from_json(entry["step"]), str(entry["fingerprint"]),
                                          dict(entry.get("facts") or {}), _recorded_unix(entry.get("recorded_unix")),
                                          _steady(path, name, entry.get("steady")))
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as err:
            why = f"[{name}] is a malformed section ({type(err).__name__}: {err})"
            if not skip_damaged:
                raise ValueError(why) from None
            logger.warning("profile %s %s, unusable: re-profiling it; it will be replaced once a training step is "
                           "recorded (the file's other sections still serve)", path, why)
    return readable


def _recorded_unix(value) -> Optional[float]:
    """When the section was recorded (seconds since the epoch; None: not said). Anything but a finite, non-negative
    number that a date can be made of is a malformed section (NaN, which JSON readers take, stopped `profile show`
    with a traceback; true read as 1970)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not finite(value) or value < 0:
        raise ValueError(f"recorded_unix must be a time in seconds, got {value!r}")
    try:
        datetime.datetime.fromtimestamp(value)
    except (ValueError, OverflowError, OSError) as err:  # past year 9999, or the platform's time_t
        raise ValueError(f"recorded_unix must be a time in seconds a date can be made of, got {value!r} ({err})") \
            from None
    return float(value)


def _steady(path: str, section: str, data) -> Optional[SteadyTimings]:
    """The section's steady timings; None, with a warning, where they are malformed: they only price steps
    (plan/profile_timings.py), and the access order beside them still serves eviction."""
    try:
        return SteadyTimings.from_json(data)
    except (ValueError, TypeError, OverflowError) as err:
        logger.warning("profile %s [%s]: its steady timings are unusable (%s) and are ignored", path, section, err)
        return None


def rank_files(path: str) -> List[str]:
    """The files of ``path``'s name that the ranks of a multi-rank run wrote, ``<root>.rank<r><ext>``
    (integrations/deepspeed/profiling.rank_profile_path names them), that exist, by rank."""
    root, ext = os.path.splitext(path)
    pattern = re.compile(rf"{re.escape(root)}\.rank(\d+){re.escape(ext)}")
    matches = (pattern.fullmatch(name) for name in glob.glob(f"{glob.escape(root)}.rank*{glob.escape(ext)}"))
    return [match.group(0) for match in sorted(filter(None, matches), key=lambda match: int(match.group(1)))]


# How every profile file begins: its writer (_replace_file) puts the format version first. Only this much of a file
# is read to tell (each rank checks every rank's file at start-up: helper-239).
_PROFILE_START = re.compile(rb'\s*\{\s*"version"\s*:')
_START_BYTES = 4096


def foreign_file_reason(path: str) -> Optional[str]:
    """Why the existing file at ``path`` is not a profile, where it is not one: a run would replace it with its own
    profile, and the user's file would be lost (helper-234: profile_path mistyped as the DeepSpeed config). None for
    a missing or empty file, and for one that begins as every profile does, of any version or damaged in its
    sections (those are re-profiled and replaced, with a warning: ``load_section``)."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(_START_BYTES)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"it cannot be read to tell ({err})"
    if not start or _PROFILE_START.match(start):
        return None
    return "it does not begin as a profile does ({\"version\": ...)"


def load_section(path: Optional[str], section: str, expected_fingerprint: str,
                 facts: Optional[dict] = None) -> Optional[StepProfile]:
    """The step saved in ``section`` if the file has one recorded for ``expected_fingerprint``; else None, with a
    warning that says why (missing file or section: silent; a stale one names the ``facts`` that differ from the
    saved ones). Never raises for a bad file."""
    if not path or not os.path.exists(path):
        return None
    try:
        sections = read_sections(path, skip_damaged=True)  # one damaged section spoils only itself
    except (OSError, ValueError) as err:
        logger.warning("profile %s is unusable (%s): re-profiling; it will be replaced once a training step is "
                       "recorded", path, err)
        return None
    entry = sections.get(section)
    if entry is None:
        return None
    if entry.fingerprint != expected_fingerprint:
        logger.warning("profile %s [%s] is stale: it was recorded for another model or config (fingerprint %s, this "
                       "run %s%s); re-profiling, it will be replaced once a training step is recorded", path, section,
                       entry.fingerprint, expected_fingerprint, _facts_that_differ(entry.facts, facts or {}))
        return None
    return entry.step


def _facts_that_differ(saved: dict, facts: dict) -> str:
    """"; <fact> <saved> -> <this run's>, ..." for the facts a stale section was recorded with that differ from this
    run's; a fact it did not note was not fingerprinted by the tencache that recorded it (helper-239: an upgrade that
    fingerprints a new fact makes every profile stale once, and "another model or config" alone misled)."""
    facts = json.loads(json.dumps(facts, default=str))  # (as the file holds them: tuples as lists, dtypes as text)
    differ = [f"{key} {saved[key]!r} -> {value!r}" if key in saved else f"{key} not noted (an older tencache's profile)"
              for key, value in sorted(facts.items()) if saved.get(key, object()) != value]
    return "; " + ", ".join(differ) if differ else ""


def save_section(path: Optional[str], section: str, section_fingerprint: str, step: StepProfile,
                 facts: Optional[dict] = None) -> None:
    """Replace ``section`` in the profile file atomically (write a temporary file, then rename). Sections of
    another format version are dropped."""
    if not path:
        return
    with _lock:
        data = {"version": PROFILE_VERSION, "sections": _readable_sections(path)}
        data["sections"][section] = {"fingerprint": section_fingerprint, "recorded_unix": time.time(),
                                     "facts": dict(facts or {}), "step": step.to_json()}
        _replace_file(path, data)


def save_steady(path: Optional[str], section: str, section_fingerprint: str, steady: SteadyTimings) -> bool:
    """Set the steady timings of ``section`` where the file holds it for ``section_fingerprint`` and no summary of
    more steps (the rest of the file as it was, atomically). False, nothing written, where it does not (another
    run replaced the section meanwhile, or an earlier run timed more of its repeats)."""
    if not path:
        return False
    with _lock:
        sections = _readable_sections(path)
        entry = sections.get(section)
        if not isinstance(entry, dict) or entry.get("fingerprint") != section_fingerprint:
            return False
        kept = _steady(path, section, entry.get("steady"))
        if kept is not None and kept.steps > steady.steps:
            return False  # a longer summary of the same sequence (an earlier run's) stays
        sections[section] = dict(entry, steady=steady.to_json())
        _replace_file(path, {"version": PROFILE_VERSION, "sections": sections})
        return True


def _readable_sections(path: str) -> dict:
    """The sections of the file as JSON, or {} where it is missing, unreadable or of another format version."""
    try:
        with open(path) as handle:
            existing = json.load(handle)
        if existing.get("version") == PROFILE_VERSION and isinstance(existing.get("sections"), dict):
            return dict(existing["sections"])
    except (OSError, ValueError, AttributeError):
        pass
    return {}


def _replace_file(path: str, data: dict) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=".profile-")
    try:
        with os.fdopen(descriptor, "w") as handle:
            # mkstemp makes the file 0600: the profile would turn unreadable to the others sharing it at each save
            with contextlib.suppress(OSError):  # (a file system that refuses chmod keeps its own modes)
                os.fchmod(handle.fileno(), _mode_for(path))
            json.dump(data, handle)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _mode_for(path: str) -> int:
    """The permissions of the file ``path`` names, or where there is none, those a new file gets (0666 less this
    process's umask, read from /proc: setting it to read it would change it for every thread meanwhile)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        pass
    try:
        with open("/proc/self/status") as handle:
            umask = next(int(line.split()[1], 8) for line in handle if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = 0o022
    return 0o666 & ~umask
