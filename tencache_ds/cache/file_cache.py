"""Whole swap files held in pageable host memory. Owns: which files are held (LRU within a HostBudget), their
bytes, and whether each file is written through to storage or only back on eviction. Does not own: the I/O
(callers pass a DirectFileIO) or which files exist (DeepSpeed's optimizer swapper names them).

Used for the optimizer's swap files (fp32 master weights, Adam moments, gradient fragments): every step reads
each one and writes it back, so with room in host memory the reads become copies. Write policy per file:
- write-through for files DeepSpeed copies into checkpoints (state files): storage is always current, so a
  checkpoint, a crash or a reader outside the process sees what stock DeepSpeed would have written;
- write-back for files it never checkpoints (``write_back(path)`` true: gradient fragments, which live for
  one step): they reach storage only if evicted while still needed.

A held file is checked against the file on storage (size, inode, mtime) before it is served: if anything else
replaced it (a checkpoint load copies files over the swap folder), the copy is dropped and storage wins.
"""
import collections
import dataclasses
import functools
import os
import threading
import weakref
from concurrent.futures import Future
from typing import Callable, Optional, Tuple

import torch

from ..io.direct_io import DirectFileIO
from ..plan.next_use import NextUseIndex, choose_victim
from ..profile.recorder import StepRecorder
from .host_budget import HostBudget


@dataclasses.dataclass(eq=False)
class CachedFile:
    """The newest bytes of one file. ``on_storage`` is the file's (size, inode, mtime_ns) after our last write
    reached it, None while that write is in flight or while ``dirty`` (not written yet)."""

    data: torch.Tensor  # uint8
    dirty: bool = False
    write: Optional[Future] = None
    on_storage: Optional[Tuple[int, int, int]] = None


def _file_identity(path: str) -> Optional[Tuple[int, int, int]]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_size, st.st_ino, st.st_mtime_ns)


def _note_on_storage(entry_ref, path: str, future: Future) -> None:
    entry = entry_ref()
    if entry is not None and future.exception() is None:
        entry.on_storage = _file_identity(path)


class FileCache:
    """LRU cache of whole files (offset-0 requests). Thread-safe. Invariant: ``budget`` holds exactly the bytes
    of the entries in ``_files``."""

    def __init__(self, budget: HostBudget, io: DirectFileIO, write_back: Callable[[str], bool]):
        self._budget = budget
        self._io = io
        self._write_back = write_back
        self._files: "collections.OrderedDict[str, CachedFile]" = collections.OrderedDict()
        self._lock = threading.RLock()
        self.hits = self.misses = self.evictions = self.writes_avoided = 0  # COUNT
        # Reads repeat in the same order every step (sub-group 0, 1, ...): a cyclic scan, where least recently
        # used is the worst choice; once the order is known, evict the file needed farthest ahead (Belady).
        self.recorder = StepRecorder()
        self.next_use: Optional[NextUseIndex] = None

    def read(self, path: str, dest: torch.Tensor) -> bool:
        """Copy the first bytes of ``path`` into ``dest`` if held (True), else False (caller reads storage)."""
        nbytes = dest.numel() * dest.element_size()
        with self._lock:
            self.recorder.touch(path)
            entry = self._files.get(path)
            if entry is not None and not entry.dirty and entry.write is not None and entry.write.done():
                entry.write.result()  # surface a failed write-through instead of serving bytes storage lacks
            if entry is not None and not entry.dirty and entry.on_storage is not None \
                    and entry.on_storage != _file_identity(path):
                self._drop(path)  # replaced behind our back: storage wins
                entry = None
            if entry is None or entry.data.numel() < nbytes:
                if entry is not None:
                    self._flush(path, entry)
                    self._drop(path)
                self.misses += 1
                return False
            self._files.move_to_end(path)
            self.hits += 1
        dest.view(torch.uint8).view(-1).copy_(entry.data[:nbytes])
        return True

    def write(self, path: str, source: torch.Tensor) -> Future:
        """Hold ``source``'s bytes as the file's new content; returns the future of the storage write
        (already done for a write-back file, which storage receives only on eviction)."""
        nbytes = source.numel() * source.element_size()
        with self._lock:
            old = self._files.pop(path, None)
            if old is not None:
                self._drop_entry(old)
                del old  # free the old bytes before allocating the new ones
            if not self._make_room(nbytes, path):
                return self._io.write(source, path)  # not worth holding (or too big): plain write
            data = torch.empty(nbytes, dtype=torch.uint8)
            data.copy_(source.reshape(-1).view(torch.uint8))
            entry = CachedFile(data)
            self._files[path] = entry
            if self._write_back(path):
                entry.dirty = True
                self.writes_avoided += 1
                done = Future()
                done.set_result(nbytes)
                return done
            entry.write = self._io.write(source, path)
            # A weak reference: entry -> future -> callback -> entry would be a cycle that keeps each replaced
            # file's bytes alive until the garbage collector happens to run.
            entry.write.add_done_callback(functools.partial(_note_on_storage, weakref.ref(entry), path))
            return entry.write

    def clear(self) -> None:
        """Forget every file (dirty ones are written first)."""
        with self._lock:
            for path in list(self._files):
                self._flush(path, self._files[path])
                self._drop(path)

    def stats(self) -> dict:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                    "writes_avoided": self.writes_avoided, "files": len(self._files),
                    "bytes": sum(e.data.numel() for e in self._files.values())}

    # ------------------------------------------------------------------------------------------- private
    def _make_room(self, nbytes: int, incoming: str) -> bool:
        """Reserve ``nbytes`` for ``incoming``, evicting as needed; False if it should not be held. With the
        order known, a file is only admitted in place of one needed later than it (Belady with bypass: in a
        cyclic scan the cache then keeps a fixed share of the files instead of cycling all of them out)."""
        if nbytes > self._budget.total_bytes:
            return False
        position = self.recorder.position
        while not self._budget.try_reserve(nbytes):
            if not self._files:
                return False  # the rest of the budget is held by others (the parameter cache)
            path = choose_victim(list(self._files), self.next_use, position)
            if self.next_use is not None and \
                    self.next_use.distance(path, position) <= self.next_use.distance(incoming, position):
                return False
            self._flush(path, self._files[path])
            self._drop(path)
            self.evictions += 1
        return True

    def _flush(self, path: str, entry: CachedFile) -> None:
        if entry.dirty:
            self._io.write(entry.data, path).result()
            entry.dirty = False

    def _drop(self, path: str) -> None:
        self._drop_entry(self._files.pop(path))

    def _drop_entry(self, entry: CachedFile) -> None:
        if entry.write is not None:
            entry.write.result()
        self._budget.release(entry.data.numel())
