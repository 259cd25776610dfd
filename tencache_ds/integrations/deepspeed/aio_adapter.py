"""DeepSpeed's aio-handle interface over tencache's I/O engine and buffer pool. Owns: the few handle methods that
DeepSpeed's optimizer-swapping helpers (swap_tensor/optimizer_utils.py, async_swapper.py, utils.py) call, so
those helpers run unchanged, and bit for bit as in stock, on our buffers and our I/O.
"""
from concurrent.futures import Future
from typing import Optional

import torch

from ...cache.file_cache import FileCache
from ...io.direct_io import DirectFileIO
from ...memory.pool import BufferPool


_DONE = Future()
_DONE.set_result(0)


class AioHandleAdapter:
    """``async_pread``/``async_pwrite`` queue a request and return 0; ``wait()`` completes every request queued
    since the last wait and returns how many (stock semantics); ``is_pinned`` means "needs no bounce copy",
    which for us is "lies in our pool" (DeepSpeed uses it to tell its buffers from optimizer-created tensors)."""

    def __init__(self, io: DirectFileIO, pool: BufferPool, cache: Optional[FileCache] = None):
        self._io = io
        self._pool = pool
        self._cache = cache  # whole files held in host memory (config "host_cache_bytes"), or None
        self._pending = []

    def async_pread(self, buffer: torch.Tensor, path: str, file_offset: int = 0) -> int:
        if self._cache is not None and file_offset == 0 and self._cache.read(path, buffer):
            self._pending.append(_DONE)
        else:
            self._pending.append(self._io.read(buffer, path, file_offset=file_offset))
        return 0

    def async_pwrite(self, buffer: torch.Tensor, path: str, file_offset: int = 0) -> int:
        # DeepSpeed's optimizer helpers write whole files at offset 0; anything else bypasses the cache.
        if self._cache is not None and file_offset == 0:
            self._pending.append(self._cache.write(path, buffer))
        else:
            self._pending.append(self._io.write(buffer, path, file_offset=file_offset))
        return 0

    def wait(self) -> int:
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()
        return len(pending)

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return self._pool.owns(tensor)
