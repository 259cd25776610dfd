"""Fixtures shared across test folders."""
import pytest

from tencache_ds.io.direct_io import DirectFileIO


@pytest.fixture
def io():
    """A real I/O engine (two threads), closed after the test."""
    engine = DirectFileIO(num_threads=2)
    yield engine
    engine.close()
