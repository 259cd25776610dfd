"""Build of the native arena (csrc/). Project metadata lives in pyproject.toml; setuptools merges the two.

TENCACHE_BUILD_NATIVE=0 skips the extension (no C compiler needed); tencache_ds.memory.native_available()
then returns False and PinnedArena raises TencacheResourceError saying how to build it.
"""
import os

from setuptools import Extension, setup


def _native_extensions() -> list:
    if os.environ.get("TENCACHE_BUILD_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return []
    return [
        Extension(
            "tencache_ds._tencache_arena",
            sources=["csrc/arena.c", "csrc/module.c"],
            include_dirs=["csrc/include"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            libraries=["pthread"],
            depends=["csrc/include/tencache/arena.h"],  # rebuild when it changes; ships it in the sdist
        )
    ]


setup(ext_modules=_native_extensions())
