"""An optimizer state tensor kept in a dtype other than its store's (the store holds a sub-group in the masters'
dtype; DeepSpeed's Muon keeps its momentum in the communication dtype, bf16 beside fp32 masters). Owns: how many of
the store's elements hold such a tensor as its own bytes, the view of those bytes in the tensor's dtype, and the
narrowing of a swap file stock DeepSpeed wrote for it (stock widens every state to the masters' dtype: a checkpoint
of its NVMe offload). Used by integrations/deepspeed/optimizer_swapper.py. Pure: torch tensors and files."""
import os

import torch

from ..errors import TencacheError
from ..io.stale_files import hidden_name

NARROWING_KIND = "narrowing"  # the ``hidden_name`` kind of a narrowed file before its rename (a start sweeps them)


def stored_numel(numel: int, dtype: torch.dtype, store_dtype: torch.dtype) -> int:
    """Elements of ``store_dtype`` that hold ``numel`` elements of ``dtype`` byte for byte (rounded up)."""
    return -(-numel * dtype.itemsize // store_dtype.itemsize)


def viewed_as(buffer: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The first ``numel`` elements of ``dtype`` in ``buffer``'s bytes (the same memory, never a copy or a cast)."""
    return buffer.view(torch.uint8).narrow(0, 0, numel * dtype.itemsize).view(dtype)


def narrow_stock_layout(path: str, numel: int, dtype: torch.dtype, store_dtype: torch.dtype,
                        own_bytes: int, stock_bytes: int) -> bool:
    """If the swap file at ``path`` is in stock's layout (``stock_bytes`` or more: ``numel`` values widened to
    ``store_dtype``) where this store's is ``own_bytes`` (the values as ``dtype``), rewrite it in this store's layout,
    provided no value changes; True if it was rewritten. The new file replaces the old one by rename, so that a
    checkpoint's file linked into the swap folder is left as it was. A value that ``dtype`` cannot hold exactly (a
    state stock kept wider than the optimizer made it) is refused: narrowing it would change the run's numbers."""
    if own_bytes >= stock_bytes or not os.path.exists(path) or os.path.getsize(path) < stock_bytes:
        return False  # this store's layout, or a file the read will report
    wide = torch.from_file(path, shared=False, size=numel, dtype=store_dtype)
    narrow = _narrowed_exactly(wide, dtype)
    if narrow is None:
        raise TencacheError(
            f"swap file {path} holds its state in {store_dtype}, as stock DeepSpeed's NVMe offload writes it (a "
            f"checkpoint it saved), with values that {dtype}, the optimizer's own dtype for it and the one tencache "
            f"keeps, does not hold exactly; narrowing them would change the run. Resume this checkpoint without "
            f"tencache_ds, or with zero_optimization.offload_optimizer.device \"cpu\"")
    data = torch.zeros(own_bytes, dtype=torch.uint8)
    viewed_as(data, numel, dtype).copy_(narrow)
    staged = os.path.join(os.path.dirname(path), hidden_name(os.path.basename(path), NARROWING_KIND))
    try:
        with open(staged, "wb") as handle:
            handle.write(data.numpy().tobytes())
        os.replace(staged, path)
    except BaseException:  # a full disk, say: no half-written file left behind, the old one stays
        if os.path.exists(staged):
            os.remove(staged)
        raise
    return True


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _narrowed_exactly(wide: torch.Tensor, dtype: torch.dtype):
    """``wide``'s values as ``dtype``, bit for bit what widening them gave, or None where some value is no widened
    ``dtype`` value. bf16 from fp32: the high half of each word, where every low half is zero (a cast turned a NaN
    into another NaN's bits, and a NaN was refused as a value bf16 "does not hold": helper-217). Otherwise a cast,
    its widening compared bit for bit with ``wide``."""
    if dtype == torch.bfloat16 and wide.dtype == torch.float32:
        bits = wide.view(torch.int32)
        if bool((bits & 0xFFFF).any()):
            return None
        return (bits >> 16).to(torch.int16).view(torch.bfloat16)
    narrow = wide.to(dtype)
    same = torch.equal(narrow.to(wide.dtype).view(_BITS[wide.element_size()]), wide.view(_BITS[wide.element_size()]))
    return narrow if same else None
