"""The package logger. Owns: its name and default handler. Like DeepSpeed's own logger, it prints INFO to stdout
unless the application configured the "tencache_ds" logger itself."""
import logging
import sys

logger = logging.getLogger("tencache_ds")
if not logger.handlers:
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("[tencache] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
