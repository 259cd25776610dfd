"""CUDA registration of host memory. Owns: cudaHostRegister/cudaHostUnregister of whole arena regions and the
degrade-with-a-warning policy when that fails, and reading how much torch's own CUDA host allocator has pinned (the
stats count it beside ours). Does not own: mapping or page-locking (csrc/arena.c).

Registering a region makes every tensor viewed over it report is_pinned() and lets H2D/D2H copies from it
run asynchronously at full PCIe speed. Without it, copies still work but are staged and synchronous.
Registration is done once per region, after the arena is built and outside any arena lock: it pins every
page and can take hundreds of milliseconds per GiB (see Note [Pinned arena design] in csrc/arena.c).
"""
import logging
import warnings
from typing import List, Optional, Sequence, Tuple

from ..units import fmt_bytes

logger = logging.getLogger(__name__)

_CUDA_HOST_REGISTER_DEFAULT = 0  # flags: plain page-locked host memory for the current context


def cuda_available() -> bool:
    """True when torch is importable and sees a CUDA device (does not create a CUDA context)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _code(result) -> int:
    # torch returns a pybind11 cudaError enum; int() gives the raw code (torch/cuda/_pin_memory_utils.py does so).
    return int(result)


def host_register(base: int, nbytes: int) -> Tuple[bool, str]:
    """cudaHostRegister(base, nbytes, 0). Returns (ok, error text); never raises for a CUDA error code."""
    import torch
    cudart = torch.cuda.cudart()
    result = cudart.cudaHostRegister(base, nbytes, _CUDA_HOST_REGISTER_DEFAULT)
    if _code(result) == 0:
        return True, ""
    try:
        text = cudart.cudaGetErrorString(result)
    except Exception:  # a code the binding cannot name; the number is still useful
        text = "unknown"
    return False, f"cudaError {_code(result)} ({text})"


def host_unregister(base: int) -> bool:
    """cudaHostUnregister(base). Returns False (and logs) on a CUDA error instead of raising: it runs at close."""
    import torch
    code = _code(torch.cuda.cudart().cudaHostUnregister(base))
    if code != 0:
        logger.warning("cudaHostUnregister(0x%x) failed with cudaError %d", base, code)
    return code == 0


def register_regions(regions: Sequence[Tuple[int, int]], name: str,
                     into: Optional[List[Tuple[int, int]]] = None) -> List[Tuple[int, int]]:
    """Register each (base, nbytes) region with CUDA; returns those that succeeded, appended to ``into`` (when
    given) as each is: an interruption part way leaves the caller knowing what to unregister.

    Warns once (for all the regions that failed): the arena still works, but copies from the failed
    regions are synchronous and slower.
    """
    registered = [] if into is None else into
    failures = []
    for base, nbytes in regions:
        ok, error = host_register(base, nbytes)
        if ok:
            registered.append((base, nbytes))
        else:
            failures.append(f"{fmt_bytes(nbytes)} at 0x{base:x}: {error}")
    if failures:
        warnings.warn(
            f"{name}: cudaHostRegister failed for {len(failures)} of {len(regions)} regions "
            f"({'; '.join(failures)}). Transfers from those slots still work but are synchronous and slower.",
            RuntimeWarning, stacklevel=3)
    return registered


def unregister_regions(regions: Sequence[Tuple[int, int]]) -> None:
    """Undo register_regions; to be called before the regions are unmapped."""
    for base, _nbytes in regions:
        host_unregister(base)


def torch_host_allocator_bytes(peak: bool = False) -> int:
    """Pinned bytes torch's CUDA host allocator holds now, or at most so far (``peak``): ``tensor.pin_memory()``,
    which DeepSpeed's accelerator calls for stock CPU offload's buffers. cudaHostAlloc pins without mlock, so VmLck
    does not count them. 0 without CUDA or before CUDA was initialised (nothing can have been pinned that way then).
    DeepSpeed 0.19.8's swap buffers are mlock'ed by its own pin manager, not this allocator: no byte is in both."""
    global _host_stats_missing_warned
    key = "allocated_bytes.peak" if peak else "allocated_bytes.current"
    try:
        import torch
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return 0
        stats = torch.cuda.host_memory_stats()
        if key in stats:
            return int(stats[key])
        problem = f"torch.cuda.host_memory_stats() has no {key}"
    except Exception as err:  # an older torch, or a driver error: the step goes on, the number is missing
        problem = f"torch.cuda.host_memory_stats() failed: {err}"
    if not _host_stats_missing_warned:  # stock CPU offload's pinned memory would read as 0 B again: say so once
        _host_stats_missing_warned = True
        logger.warning("%s: memory pinned through torch (stock CPU offload's optimizer state) is not counted", problem)
    return 0


_host_stats_missing_warned = False
