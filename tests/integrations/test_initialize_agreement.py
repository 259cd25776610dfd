"""When deepspeed.initialize's check of a configuration sets deepspeed.comm up first (install.py
``_init_distributed_as_initialize_does``): where the job has several ranks by any launcher's word, so that a rank
refusing alone stops the others; never for a process alone, whose refusal comes before any launcher discovery. The
engine-level case: tests/deepspeed/test_rank_agreement.py (``initialize-first``)."""
import inspect

import pytest

pytest.importorskip("deepspeed")
import deepspeed  # noqa: E402
from deepspeed import comm  # noqa: E402

from tencache_ds.integrations.deepspeed import install  # noqa: E402


@pytest.mark.parametrize("env, expected", [
    ({}, 0),                                # a process alone
    ({"WORLD_SIZE": "1"}, 0),
    ({"WORLD_SIZE": "2"}, 1),               # torchrun, DeepSpeed's launcher
    ({"OMPI_COMM_WORLD_SIZE": "4"}, 1),     # deepspeed --launcher openmpi, mpirun (helper-232: no WORLD_SIZE there)
    ({"PMI_SIZE": "2"}, 1),                 # MPICH, Intel MPI
    ({"SLURM_NTASKS": "8"}, 1),             # srun
    ({"WORLD_SIZE": "many"}, 0),            # not a number: no launcher's
])
def test_the_early_set_up_is_made_where_a_launcher_says_the_job_has_several_ranks(monkeypatch, env, expected):
    for name in install.JOB_SIZE_ENVS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    calls = []
    monkeypatch.setattr(comm, "is_initialized", lambda: False)
    monkeypatch.setattr(comm, "init_distributed", lambda **kwargs: calls.append(kwargs))
    install._init_distributed_as_initialize_does(inspect.signature(deepspeed.initialize), {})
    assert len(calls) == expected
