"""Where a run's JSON records are on disk and how to read them. Owns: the archived form of a record (a result file
of scripts/train.py, a bench's bench.json) and the reads that find either form. Does not own: what a record holds
(bench/report_runs.py, scripts/validate_estimate.py) or writing one (scripts/train.py, cli/bench.py write them plain).

A record is read from its name or, where it was archived, from NAME.gz beside it. docs/ keeps its records archived
(``scripts/archive_records.py``; tests/test_records.py checks that it does): gzip takes a result file to about a
twentieth of its size, and the records were three fifths of a working tree that the device tool refuses above 64 MiB
(the ninth GPU lease's first call was refused at 74 MiB). Where both forms exist the plain file is read: it is the
one something wrote since.
"""
import fnmatch
import gzip
import json
import os
from typing import IO, Any, List, Optional

ARCHIVED_SUFFIX = ".gz"
# The records docs/ keeps archived, by file name (fnmatch patterns): the large, machine-written ones. Machine files,
# predictions and profiles stay plain: commands take them as arguments (--machine, --profile).
ARCHIVED_NAMES = ("*.result.json", "bench.json")


def stored_path(path: str) -> Optional[str]:
    """The file that holds the record named ``path``: ``path`` itself, else its archived form, else None."""
    for candidate in (path, path + ARCHIVED_SUFFIX):
        if os.path.isfile(candidate):
            return candidate
    return None


def record_exists(path: str) -> bool:
    return stored_path(path) is not None


def open_record(path: str) -> IO[str]:
    """The record named ``path``, opened as text, in either form. FileNotFoundError names both paths looked for."""
    stored = stored_path(path)
    if stored is None:
        raise FileNotFoundError(f"no record {path} (nor {path + ARCHIVED_SUFFIX})")
    return gzip.open(stored, "rt") if stored.endswith(ARCHIVED_SUFFIX) else open(stored)


def read_json_record(path: str) -> Any:
    with open_record(path) as handle:
        return json.load(handle)


def glob_records(folder: str, pattern: str) -> List[str]:
    """The records in ``folder`` whose names match ``pattern`` (fnmatch), in either form, by their plain names,
    sorted, each once."""
    if not os.path.isdir(folder):
        return []
    names = {name[:-len(ARCHIVED_SUFFIX)] if name.endswith(ARCHIVED_SUFFIX) else name for name in os.listdir(folder)}
    return sorted(os.path.join(folder, name) for name in names if fnmatch.fnmatch(name, pattern))


def is_archivable(name: str) -> bool:
    """Whether a file of this name is one docs/ keeps archived (``ARCHIVED_NAMES``)."""
    return any(fnmatch.fnmatch(name, pattern) for pattern in ARCHIVED_NAMES)


def archive(path: str) -> str:
    """Replace the plain record ``path`` by its archived form (gzip, no name or time in its header, so that the same
    record archives to the same bytes); returns the new path. The plain file is removed only once the archive is
    written whole and reads back to the same bytes."""
    target = path + ARCHIVED_SUFFIX
    with open(path, "rb") as handle:
        data = handle.read()
    partial = target + ".partial"
    with open(partial, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed:
        packed.write(data)
    with gzip.open(partial, "rb") as check:
        if check.read() != data:
            os.remove(partial)
            raise OSError(f"{partial} did not read back as {path}; {path} left as it was")
    os.replace(partial, target)
    os.remove(path)
    return target
