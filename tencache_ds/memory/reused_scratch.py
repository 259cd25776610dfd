"""One host buffer reused for a run of transient copies of varying size. Owns: growing it to the largest copy asked
for, up to a ceiling, handing out views of its first elements, and letting it go. Does not own: what is copied into
it, or when a run of copies ends (integrations/deepspeed/gradient_norms.py).

Why: a fresh tensor above glibc's mmap threshold (at most 32 MiB) is a new mapping, unmapped when freed, so every
such temporary faults all of its pages in again; on this project's 2-core VM first touch runs at about 3.3 GiB/s
against 32 GiB/s for a copy into memory already touched (2026-12-06). Stage 3 takes each gradient's norm over a
float64 copy of it: on gpt2-1.3b that is 9.5 GiB of fresh memory a backward (docs/benchmarks.md, "Beyond RAM, traced
by phase"). Copied into one buffer instead, only the buffer's first use of each page
faults.

A view starts at the buffer's first element, so the copy sits at the same alignment as a fresh tensor's and any
kernel that runs over it sees the same memory layout: the values and their order are the fresh copy's.

The ceiling (``max_bytes``): a copy larger than it gets no view (``None``: the caller makes it fresh, as before), so
that the buffer never holds more than that beside what the process held without it. ``largest_numel``: the largest
copy the caller expects within the ceiling, allocated at the first view, so that a run of copies that grows (the
largest one coming last) takes one buffer, not one per larger copy, each faulted in anew.
"""
from typing import Optional

import torch


class ReusedScratch:
    """``view(numel, dtype, device)``: a contiguous 1-D tensor of ``numel`` elements at the start of the buffer,
    which is replaced by a larger one when too small (or of another dtype or device); ``None`` above ``max_bytes``.
    A view is valid until the next ``view`` or ``release``: one copy at a time. ``release()`` drops the buffer (its
    memory goes back when no view of it is left). Counters: ``views`` handed out, ``refused`` (copies above the
    ceiling), ``grows`` (buffers allocated), ``peak_bytes`` (the largest buffer)."""

    def __init__(self, max_bytes: int, largest_numel: int = 0):
        self.max_bytes = int(max_bytes)
        self.largest_numel = int(largest_numel)
        self._buffer: Optional[torch.Tensor] = None
        self.views = 0
        self.refused = 0
        self.grows = 0
        self.peak_bytes = 0

    def view(self, numel: int, dtype: torch.dtype, device: torch.device) -> Optional[torch.Tensor]:
        element_size = torch.empty((), dtype=dtype).element_size()
        if numel * element_size > self.max_bytes:
            self.refused += 1
            return None
        buffer = self._buffer
        if buffer is None or buffer.dtype != dtype or buffer.device != device or buffer.numel() < numel:
            self._buffer = None  # the old buffer's memory goes back before the new one is taken
            expected = self.largest_numel if self.largest_numel * element_size <= self.max_bytes else 0
            buffer = self._buffer = torch.empty(max(numel, expected), dtype=dtype, device=device)
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
