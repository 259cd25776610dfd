"""One host buffer reused for a run of transient copies of varying size. Owns: growing it to the largest copy asked
for, handing out views of its first elements, and letting it go. Does not own: what is copied into it, or when a
run of copies ends (integrations/deepspeed/gradient_norms.py).

Why: a fresh tensor above glibc's mmap threshold (at most 32 MiB) is a new mapping, unmapped when freed, so every
such temporary faults all of its pages in again; on this project's 2-core VM first touch runs at about 2 GB/s
against 16 GB/s for a copy into memory already touched. Stage 3 takes each gradient's norm over a float64 copy of
it: on gpt2-1.3b that is 8.5 GiB of fresh memory a backward, 4.7 s of a 29 s step (docs/estimate.md, "gpt2-1.3b's
backward"). Copied into one buffer instead, only the buffer's first use of each page faults.

A view starts at the buffer's first element, so the copy sits at the same alignment as a fresh tensor's and any
kernel that runs over it sees the same memory layout: the values and their order are the fresh copy's.
"""
from typing import Optional

import torch


class ReusedScratch:
    """``view(numel, dtype, device)``: a contiguous 1-D tensor of ``numel`` elements at the start of the buffer,
    which is replaced by a larger one when too small (or of another dtype or device). A view is valid until the
    next ``view`` or ``release``: one copy at a time. ``release()`` drops the buffer (its memory goes back when no
    view of it is left). Counters: ``views`` handed out, ``grows`` (buffers allocated), ``peak_bytes`` (the
    largest buffer)."""

    def __init__(self):
        self._buffer: Optional[torch.Tensor] = None
        self.views = 0
        self.grows = 0
        self.peak_bytes = 0

    def view(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buffer = self._buffer
        if buffer is None or buffer.dtype != dtype or buffer.device != device or buffer.numel() < numel:
            self._buffer = None  # the old buffer's memory goes back before the new one is taken
            buffer = self._buffer = torch.empty(numel, dtype=dtype, device=device)
            self.grows += 1
            self.peak_bytes = max(self.peak_bytes, buffer.numel() * buffer.element_size())
        self.views += 1
        return buffer[:numel]

    @property
    def held_bytes(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel() * self._buffer.element_size()

    def release(self) -> None:
        self._buffer = None


__all__ = ["ReusedScratch"]
