"""Where a run's JSON records are on disk and how to read them. Owns: the archived form of a record (a result file
of scripts/train.py, a bench's bench.json) and the reads that find either form. Does not own: what a record holds
(bench/report_runs.py, scripts/validate_estimate.py) or writing one (scripts/train.py, cli/bench.py write them plain).

A record is read from its name or, where it was archived, from NAME.gz beside it. docs/ keeps its records archived
(``scripts/archive_records.py``; tests/test_records.py checks that it does): gzip took docs/' records from 40.2 to
3.7 MiB, and they were three fifths of a working tree that the device tool refuses above 64 MiB (the ninth GPU lease's
first call was refused at 74 MiB). Where both forms exist the plain file is read: it is the one something wrote since
(the bench removes both forms of what it is about to write, cli/bench.py).
"""
import contextlib
import fnmatch
import gzip
import json
import os
import zlib
from typing import IO, Any, List, Optional

from ..io.durable import replace_durably

ARCHIVED_SUFFIX = ".gz"
# The records docs/ keeps archived, by file name (fnmatch patterns): the large, machine-written ones. Machine files,
# predictions and profiles stay plain: commands take them as arguments (--machine, --profile).
ARCHIVED_NAMES = ("*.result.json", "bench.json")


def both_forms(path: str) -> List[str]:
    """The two paths the record named ``path`` may be stored at, the plain one first: what to remove before something
    writes it anew."""
    return [path, path + ARCHIVED_SUFFIX]


def stored_path(path: str) -> Optional[str]:
    """The file that holds the record named ``path``: ``path`` itself, else its archived form, else None."""
    return next((candidate for candidate in both_forms(path) if os.path.isfile(candidate)), None)


def record_exists(path: str) -> bool:
    """Whether the record named ``path`` is on disk, in either form."""
    return stored_path(path) is not None


def _found(path: str) -> str:
    stored = stored_path(path)
    if stored is None:
        raise FileNotFoundError(f"no record {path} (nor {path + ARCHIVED_SUFFIX})")
    return stored


def _open_stored(stored: str) -> IO[str]:
    # UTF-8 whatever the locale: json.dump writes ASCII by default, but a record written with ensure_ascii=False
    # would otherwise read differently on another machine
    if stored.endswith(ARCHIVED_SUFFIX):
        return gzip.open(stored, "rt", encoding="utf-8")
    return open(stored, encoding="utf-8")


def open_record(path: str) -> IO[str]:
    """The record named ``path``, opened as text, in either form. FileNotFoundError names both paths looked for."""
    return _open_stored(_found(path))


def read_json_record(path: str) -> Any:
    """The JSON value of the record named ``path``, in either form. FileNotFoundError names both paths looked for;
    ValueError names the file read when it is not JSON or is an archive cut short or not gzip at all."""
    stored = _found(path)
    try:
        with _open_stored(stored) as handle:
            return json.load(handle)
    except (ValueError, EOFError, gzip.BadGzipFile, zlib.error) as err:  # JSON and UTF-8 errors are ValueErrors
        raise ValueError(f"{stored}: not a whole JSON record ({type(err).__name__}: {err})") from None


def glob_records(folder: str, pattern: str) -> List[str]:
    """The records in ``folder`` whose names match ``pattern`` (fnmatch), in either form, by their plain names,
    sorted, each once."""
    if not os.path.isdir(folder):
        return []
    names = {name[:-len(ARCHIVED_SUFFIX)] if name.endswith(ARCHIVED_SUFFIX) else name for name in os.listdir(folder)}
    paths = (os.path.join(folder, name) for name in names if fnmatch.fnmatch(name, pattern))
    return sorted(path for path in paths if record_exists(path))  # files only: a folder may match the pattern


def is_archivable(name: str) -> bool:
    """Whether a file of this name is one docs/ keeps archived (``ARCHIVED_NAMES``)."""
    return any(fnmatch.fnmatch(name, pattern) for pattern in ARCHIVED_NAMES)


def archive(path: str) -> str:
    """Replace the plain record ``path`` by its archived form (gzip, no name or time in its header, so that the same
    record archives to the same bytes with the same zlib); returns the new path. The plain file, often the only copy
    (a run's folder is archived before it is committed), is removed only once the archive reads back to the same
    bytes and is on the drive (io/durable.py); an archive that fails part way leaves no partial file."""
    target = path + ARCHIVED_SUFFIX
    with open(path, "rb") as handle:
        data = handle.read()
    partial = target + ".partial"
    try:
        with open(partial, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed:
            packed.write(data)
        with gzip.open(partial, "rb") as check:
            if check.read() != data:
                raise OSError(f"{partial} did not read back as {path}; {path} left as it was")
        replace_durably(partial, target)
    except BaseException:  # a full disk, an interrupt: the plain file stays, and nothing half-written beside it
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        raise
    os.remove(path)
    return target
