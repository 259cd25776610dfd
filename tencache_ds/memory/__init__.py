"""Host memory for the cache: the pinned-buffer arena (native, csrc/) and CUDA registration of its regions.

Owns: PinnedArena/ArenaSlot and whether the native library is usable. Does not own: what goes into the
slots (cache/) or how many slots of which size (plan/). Importing this package does not import torch.
"""
from ._native import native_available, native_unavailable_reason
from .arena import ArenaSlot, PinnedArena

__all__ = ["ArenaSlot", "PinnedArena", "native_available", "native_unavailable_reason"]
