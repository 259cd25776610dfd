"""Test-only start-up hook (tests/deepspeed/test_master_copies.py puts this folder first on PYTHONPATH): the fp32
masters that tencache writes behind (integrations/deepspeed/master_write_behind.py) reach their files one after the
other, each master ``SLOW_MASTER_WRITES_S`` seconds after the one before, as on a drive busy with other writes: the
last ones of a step land seconds after the step, so whatever reads a master file, or changes a partition, without
waiting for those writes is caught. The writes themselves are real. Patched when the module is first imported, so
that other Python processes started with this environment (cpuinfo's own child) import nothing more."""
import importlib.abc
import importlib.util
import os
import sys
import threading
import time
from concurrent.futures import Future

DELAY_S = float(os.environ.get("SLOW_MASTER_WRITES_S", "0"))
TARGET = "tencache_ds.integrations.deepspeed.master_write_behind"


def _slow(cls) -> None:
    init = cls.__init__
    queue = []  # (write, tensor, path, file_offset, future), in issue order
    ready = threading.Condition()

    def worker():
        last_path = None
        while True:
            with ready:
                while not queue:
                    ready.wait()
                write, tensor, path, file_offset, future = queue.pop(0)
            if path != last_path:  # the next master
                time.sleep(DELAY_S)
                last_path = path
            try:
                future.set_result(write(tensor, path, file_offset=file_offset).result())
            except BaseException as err:  # noqa: BLE001  (the waiter raises it)
                future.set_exception(err)

    threading.Thread(target=worker, daemon=True).start()

    def init_slowed(self, partition_views, partition_ids, fill, write, dtype):
        def write_later(tensor, path, file_offset=0):
            future = Future()
            with ready:
                queue.append((write, tensor, path, file_offset, future))
                ready.notify()
            return future
        init(self, partition_views, partition_ids, fill, write_later, dtype)

    cls.__init__ = init_slowed


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_slow(module):
            exec_module(module)
            _slow(module.MasterWriteBehind)
        spec.loader.exec_module = exec_and_slow
        return spec


if DELAY_S > 0:
    sys.meta_path.insert(0, _AfterImport())
