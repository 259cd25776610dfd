"""scripts/train.py with a checkpoint engine that serialises after its save returns, as DeepSpeed's decoupled writer
(``"checkpoint": {"writer": {"decoupled": true}}``) does: ``save`` puts the state dict on a multiprocessing queue,
which pickles it there and then (torch moves each tensor's storage into shared memory), and a spawned process writes
it with torch.save; ``commit``, which DeepSpeed calls for a decoupled engine at the next step's boundary, waits for
the writes. DeepSpeed's own decoupled engine needs an accelerator in its writer process ("Cannot access accelerator
device when none is available" on the CPU accelerator), so this stands in for it. Takes train.py's arguments."""
import os
import sys

import torch
import torch.multiprocessing as mp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import train  # noqa: E402

COMMIT = "commit"


def write_queued(queue, committed):
    """The writer process: each (state dict, path) is written when it comes; a commit is acknowledged."""
    while True:
        item = queue.get()
        if item is None:
            return
        if item == COMMIT:
            committed.set()
            continue
        state_dict, path = item
        torch.save(state_dict, path)


class QueuedCheckpointEngine:
    """The CheckpointEngine interface DeepSpeed's engine calls, writing through ``write_queued``."""

    def __init__(self):
        context = mp.get_context("spawn")
        self._queue, self._committed = context.SimpleQueue(), context.Event()
        self._writer = context.Process(target=write_queued, args=(self._queue, self._committed), daemon=True)
        self._writer.start()
        self._commit_info = None

    def create(self, info):
        self._commit_info = info

    def makedirs(self, path, exist_ok=False):
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict, path):
        self._queue.put((state_dict, path))  # pickled here: the tensors' storages move into shared memory

    def load(self, path, map_location=None):
        return torch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info):
        self._committed.clear()
        self._queue.put(COMMIT)
        if not self._committed.wait(120):
            raise RuntimeError("the queued checkpoint writer did not commit within 120 s")
        return True

    def is_data_parallel_writer(self, dp_rank):
        return True

    def is_decoupled(self):
        return True

    def set_commit_info(self, info):
        self._commit_info = info

    def get_commit_info(self):
        return self._commit_info

    def cleanup(self):
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join(60)

    def preserves_storage_sharing(self):
        return False


class WrittenAtCommitCheckpointEngine(QueuedCheckpointEngine):
    """An engine that keeps the state dicts it is given and writes them when DeepSpeed commits the save, at the end
    of ``save_checkpoint`` (not decoupled): after its save returned, as DataStates' background writer does, but
    before training goes on (what a later step changes is no concern here)."""

    def __init__(self):  # pylint: disable=super-init-not-called  (no writer process)
        self._pending, self._commit_info = [], None

    def save(self, state_dict, path):
        self._pending.append((state_dict, path))

    def commit(self, info):
        for state_dict, path in self._pending:
            torch.save(state_dict, path)
        self._pending = []
        return True

    def is_decoupled(self):
        return False

    def cleanup(self):
        pass


# TENCACHE_TEST_CHECKPOINT_ENGINE=at_commit: WrittenAtCommitCheckpointEngine (the name lets a run fork from the test
# suite's server: conftest.read_after_import)
ENGINES = {"queued": QueuedCheckpointEngine, "at_commit": WrittenAtCommitCheckpointEngine}


# TENCACHE_TEST_FILE_SYSTEM_SHARING_RANK=<rank>: that rank shares tensors through files in /dev/shm (torch's
# "file_system" strategy), so that its copies of the masters need room there and the other ranks' do not
FILE_SYSTEM_SHARING_RANK = "TENCACHE_TEST_FILE_SYSTEM_SHARING_RANK"


def main() -> int:
    from deepspeed.runtime.engine import DeepSpeedEngine
    if os.environ.get(FILE_SYSTEM_SHARING_RANK) == os.environ.get("RANK", "0"):
        mp.set_sharing_strategy("file_system")
    configure = DeepSpeedEngine._configure_checkpointing
    engine_class = ENGINES[os.environ.get("TENCACHE_TEST_CHECKPOINT_ENGINE", "queued")]

    def configure_queued(self, *args, **kwargs):
        configure(self, *args, **kwargs)
        self.checkpoint_engine = engine_class()

    DeepSpeedEngine._configure_checkpointing = configure_queued
    code = train.main(sys.argv[1:])
    return code


if __name__ == "__main__":
    sys.exit(main())
