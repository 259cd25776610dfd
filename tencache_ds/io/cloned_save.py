"""A ``torch.save`` file whose large tensors share their blocks with files that already hold their bytes. Owns: the
two passes that make such a file (``save_sharing``) and the check that every tensor's bytes were put in it.

Why: a checkpoint's ZeRO file must hold the fp32 masters (``zero_to_fp32`` reads them there), and with the optimizer
on NVMe their bytes are already in the swap files. On a file system that clones ranges (io/reflink.py) the file can
name those blocks instead of writing them again: a 1.3B-parameter fp32 model's 5.1 GB of masters cost no writes.

How, in torch's own terms (torch >= 2.6):
1. ``torch.save`` under ``torch.serialization.skip_data``, with ``storage_alignment`` set to the file system's block
   size: the file gets every record, the pickled structure and each storage's place, but no storage bytes (holes).
2. The file is read back on the ``meta`` device, which gives each storage its offset in the file; the structure
   read back is walked beside the object saved, so that each offset is paired with the storage it holds.
3. Each storage whose bytes a file holds (``sources``) is cloned from it in whole blocks; the rest of it, and every
   other storage, is written.

The result reads with ``torch.load`` as a plain ``torch.save`` of the same object would, byte for byte in every
storage. Its data records carry no CRC-32 (skip_data writes none; torch's reader does not check it, as with
``torch.serialization.set_crc32_options(False)``; Python's ``zipfile`` reports them as bad). The file is made under
a temporary name and renamed over ``path`` only once every storage is in it: a save that fails or stops half way
never leaves a file whose holes would read as zeros; a process killed before the rename leaves its temporary
file, which the next sharing save into the same checkpoint directory (its tag or another) removes. Objects are
walked through their attributes only where they pickle as their attributes (no ``__reduce__``, ``__reduce_ex__`` or
``__getstate__`` of their own); a tensor the walk cannot reach leaves a record unaccounted for, and then
``save_sharing`` returns None and the caller saves the usual way.
"""
import os
import struct
import time
import zipfile
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from ..log import logger
from .reflink import block_size, clone_range
from .stale_files import pid_in_name, remove_files_of_dead_processes

_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # a zip local file header: 30 bytes, then the name and the extra field
_LOCAL_HEADER_SIGNATURE = 0x04034B50
TEMPORARY_SUFFIX = ".sharing"


@dataclass
class SharedSave:
    """What ``save_sharing`` did: bytes cloned from ``sources``, storage bytes written, records, seconds."""
    cloned_bytes: int = 0
    written_bytes: int = 0
    records: int = 0
    seconds: float = 0.0


def supported() -> bool:
    """Has this torch the two-pass save (``skip_data`` and a configurable storage alignment: torch >= 2.6)?"""
    try:
        from torch.utils.serialization import config
    except ImportError:
        return False
    return hasattr(torch.serialization, "skip_data") and hasattr(config.save, "storage_alignment")


def save_sharing(obj, path: str, sources: Dict[int, str]) -> Optional[SharedSave]:
    """``torch.save(obj, path)``, except that a storage whose ``data_ptr()`` is a key of ``sources`` takes its bytes
    from that file (its first ``nbytes`` bytes), cloned where the file system allows. Returns what it did, or None
    (``path`` untouched) where the structure could not be accounted for: save it the usual way. Raises what the
    save raises, ``path`` untouched then too."""
    from torch.utils.serialization import config as serialization_config
    started = time.perf_counter()
    folder = os.path.dirname(os.path.abspath(path))
    block = block_size(folder)
    temporary = os.path.join(folder, _temporary_name(os.path.basename(path), os.getpid()))
    _remove_temporaries_of_killed_saves(folder)
    try:
        config = serialization_config.save
        alignment = config.storage_alignment
        config.storage_alignment = max(alignment, block)
        try:
            with torch.serialization.skip_data():
                torch.save(obj, temporary)
        finally:
            config.storage_alignment = alignment
        storages = _storages_by_offset(obj, torch.load(temporary, map_location="meta", weights_only=False))
        records = _data_records(temporary)
        if storages is None or set(storages) != set(records) or any(
                storages[offset].nbytes() != records[offset] for offset in records):
            return None
        done = SharedSave(records=len(records))
        with open(temporary, "r+b") as target:
            for offset, storage in sorted(storages.items()):
                source = sources.get(storage.data_ptr()) if storage.device.type == "cpu" else None
                cloned = 0
                if source is not None:
                    with open(source, "rb") as handle:
                        cloned = clone_range(handle.fileno(), 0, target.fileno(), offset, storage.nbytes(), block)
                done.cloned_bytes += cloned
                done.written_bytes += _write(target.fileno(), offset + cloned, storage, cloned)
        os.replace(temporary, path)
        done.seconds = time.perf_counter() - started
        return done
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def _temporary_name(name: str, pid: int) -> str:
    """The file a save by process ``pid`` makes before it is whole: hidden, never a name a loader opens."""
    return f".{name}.{pid}{TEMPORARY_SUFFIX}"


def _pid_of_temporary(candidate: str) -> Optional[int]:
    """The process whose save made ``candidate`` (``_temporary_name``: ``.<name>.<pid>.sharing``), or None if it is
    no such file."""
    if not (candidate.startswith(".") and candidate.endswith(TEMPORARY_SUFFIX)):
        return None
    name_part, _dot, pid_text = candidate[:-len(TEMPORARY_SUFFIX)].rpartition(".")
    return pid_in_name(pid_text, "") if len(name_part) > 1 else None


def _remove_temporaries_of_killed_saves(folder: str) -> None:
    """A save killed before its rename leaves its temporary file, whose shared blocks keep old masters on the drive:
    remove those of processes that are gone, in ``folder`` (the tag's) and in the folders beside it (the other tags
    of the same checkpoint directory, which later saves may never write again). Best effort: a folder that cannot
    be read or a file that cannot be removed is logged and left."""
    parent = os.path.dirname(folder)
    folders = [folder] + sorted(os.path.join(parent, name) for name in _listdir(parent)
                                if os.path.join(parent, name) != folder and os.path.isdir(os.path.join(parent, name)))
    for each in folders:
        try:
            remove_files_of_dead_processes(each, _pid_of_temporary)
        except OSError as err:
            logger.info("temporary files of killed checkpoint saves left in %s: %s", each, err)


def _listdir(folder: str) -> list:
    try:
        return os.listdir(folder)
    except OSError as err:
        logger.info("temporary files of killed checkpoint saves not looked for beside %s: %s", folder, err)
        return []


def _storages_by_offset(saved, loaded) -> Optional[dict]:
    """Each storage of ``saved``, keyed by its offset in the file ``loaded`` (``saved`` read back on ``meta``) came
    from; None where the two structures do not walk alike."""
    found = {}

    def walk(ours, theirs):
        if isinstance(ours, torch.Tensor):
            if not isinstance(theirs, torch.Tensor):
                raise LookupError
            if ours.is_meta:  # a tensor described, without bytes: torch.save writes no record for it
                return
            offset = getattr(theirs.untyped_storage(), "_checkpoint_offset", None)
            if offset is None:
                raise LookupError
            found[offset] = ours.untyped_storage()
        elif isinstance(ours, dict):
            if not isinstance(theirs, dict) or ours.keys() != theirs.keys():
                raise LookupError
            for key in ours:
                walk(ours[key], theirs[key])
        elif isinstance(ours, (list, tuple)):
            if type(theirs) is not type(ours) or len(ours) != len(theirs):
                raise LookupError
            for mine, other in zip(ours, theirs):
                walk(mine, other)
        elif _pickles_as_its_attributes(ours):
            walk(vars(ours), vars(theirs))

    try:
        walk(saved, loaded)
    except (LookupError, TypeError):
        return None
    return found


def _pickles_as_its_attributes(obj) -> bool:
    """Is ``obj`` an instance that pickle saves as its ``__dict__`` (no reduce or state methods of its own)? Only
    then does the structure read back hold its tensors where the object holds them."""
    cls = type(obj)
    if isinstance(obj, type) or not hasattr(obj, "__dict__"):
        return False
    return (cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and getattr(cls, "__getstate__", object.__getstate__) is object.__getstate__
            and not hasattr(cls, "__setstate__"))


def _data_records(path: str) -> dict:
    """Offset in the file -> size of each storage record (``<archive>/data/<key>``) of a torch.save zip file."""
    records = {}
    with open(path, "rb") as handle, zipfile.ZipFile(handle) as archive:
        for info in archive.infolist():
            if info.filename.split("/")[-2:-1] != ["data"]:
                continue
            handle.seek(info.header_offset)
            header = _LOCAL_HEADER.unpack(handle.read(_LOCAL_HEADER.size))
            if header[0] != _LOCAL_HEADER_SIGNATURE:
                raise zipfile.BadZipFile(f"{path}: no local header for {info.filename}")
            records[info.header_offset + _LOCAL_HEADER.size + header[9] + header[10]] = info.file_size
    return records


def _write(fd: int, offset: int, storage, start: int) -> int:
    """Write ``storage``'s bytes from ``start`` on at ``offset``; returns the bytes written."""
    if storage.device.type != "cpu":
        storage = storage.cpu()
    size = storage.nbytes() - start
    if size <= 0:
        return 0
    data = memoryview(torch.empty(0, dtype=torch.uint8).set_(storage).numpy())[start:]
    done = 0
    while done < size:
        done += os.pwrite(fd, data[done:], offset + done)
    return size
