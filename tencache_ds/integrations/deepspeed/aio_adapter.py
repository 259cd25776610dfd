"""DeepSpeed's aio-handle interface over tencache's I/O engine and buffer pool. Owns: the few handle methods that
DeepSpeed's optimizer-swapping helpers (swap_tensor/optimizer_utils.py, async_swapper.py, utils.py) call, so
those helpers run unchanged, and bit for bit as in stock, on our buffers and our I/O.
"""
import torch

from ...io.direct_io import DirectFileIO
from ...memory.pool import BufferPool


class AioHandleAdapter:
    """``async_pread``/``async_pwrite`` queue a request and return 0; ``wait()`` completes every request queued
    since the last wait and returns how many (stock semantics); ``is_pinned`` means "needs no bounce copy",
    which for us is "lies in our pool" (DeepSpeed uses it to tell its buffers from optimizer-created tensors)."""

    def __init__(self, io: DirectFileIO, pool: BufferPool):
        self._io = io
        self._pool = pool
        self._pending = []

    def async_pread(self, buffer: torch.Tensor, path: str, file_offset: int = 0) -> int:
        self._pending.append(self._io.read(buffer, path, file_offset=file_offset))
        return 0

    def async_pwrite(self, buffer: torch.Tensor, path: str, file_offset: int = 0) -> int:
        self._pending.append(self._io.write(buffer, path, file_offset=file_offset))
        return 0

    def wait(self) -> int:
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()
        return len(pending)

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return self._pool.owns(tensor)
