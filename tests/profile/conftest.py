"""Fixtures shared by the profile tests."""
import logging

import pytest


@pytest.fixture
def messages():
    """The tencache_ds log messages emitted during the test."""
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("tencache_ds")
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)
