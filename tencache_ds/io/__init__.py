"""File I/O for swapped tensors."""
from .direct_io import DirectFileIO, IoCounters

__all__ = ["DirectFileIO", "IoCounters"]
