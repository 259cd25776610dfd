"""Runs scripts/train.py (the real user script: real DeepSpeed engine on the CPU accelerator, real swap files)
in a process of its own per training run, and reads its result JSON. A plain single-process run, and the ranks of
a run asked for as forked (``launcher="ranks"``, ``launch_ranks(forked=True)``), are forked from forkserver.py,
which has imported torch, DeepSpeed and transformers once (half of a small run's time on 2 cores), and so is a
helper script's (``run_helper``); launcher runs, cgroup runs and runs with a /dev/shm of their own start fresh
interpreters."""
import atexit
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "scripts", "train.py")
FORKSERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forkserver.py")

# scripts/shm_buffers.py (DeepSpeed's /dev/shm all-reduce buffers), loaded by path: scripts/ is no package
_spec = importlib.util.spec_from_file_location("shm_buffers", os.path.join(REPO, "scripts", "shm_buffers.py"))
shm_buffers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shm_buffers)


def _log_run(kind, started, facts):
    """With TENCACHE_TEST_RUN_LOG=FILE (an absolute path), a JSON line per training or helper run (the test, its
    wall seconds and ``facts``, what it ran) appended to FILE: where the suite's time goes, run by run (README.md,
    under "The two commands"). Called as a run ends, however it ended: a log that cannot be written is skipped, not
    raised in place of the run's own error."""
    log = os.environ.get("TENCACHE_TEST_RUN_LOG")
    if log:
        line = dict(facts, kind=kind, test=os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
                    wall_s=round(time.monotonic() - started, 2))
        with contextlib.suppress(OSError), open(log, "a") as handle:
            handle.write(json.dumps(line, default=str) + "\n")


class TrainRun:
    def __init__(self, result, output, returncode, shm_leftovers=(), result_path=None):
        self.result, self.output, self.returncode = result, output, returncode
        self.result_path = result_path  # the file train.py wrote the result to (files beside it: rank_budgets.py)
        # DeepSpeed's /dev/shm all-reduce buffers the run left behind (then removed here): train.py removes its own
        self.shm_leftovers = list(shm_leftovers)

    @property
    def loss_bits(self):
        return [step["loss_bits"] for step in self.result["steps"]]

    @property
    def last_stats(self):
        return self.result["steps"][-1]["stats"]


def result_of(stdout):
    """The last ``RESULT {json}`` line a script printed, or None. Ranks share the launcher's stdout: another rank's
    unfinished line can come before it on the same line ("...world_size: 2RESULT {...}"), so it is found anywhere
    in a line (a flushed print of a short line is one write, never split itself)."""
    found = [line[line.index("RESULT ") + len("RESULT "):] for line in stdout.splitlines() if "RESULT " in line]
    return json.loads(found[-1]) if found else None


def launch_two_ranks(script, args, cleanup=(), timeout=900, stock=False):
    """Run a helper ``script`` (tests/deepspeed/scenarios.py) through ``deepspeed --num_gpus 2`` with ``args``,
    remove the ``cleanup`` folders afterwards, and return the RESULT rank 0 printed (the test fails with the run's
    output when there is none, or when a rank exited with an error after it: ``stock``, a run of stock's swappers,
    may end in their teardown abort, ``teardown_aborted``). As a training run: in a process group of its own (a hang
    kills both ranks), and the launch's shared-memory buffers removed whatever became of it."""
    return launch_ranks(script, args, 2, cleanup, timeout, stock=stock)


def teardown_aborted(returncode, output):
    """Stock DeepSpeed's aio handles occasionally abort the interpreter's teardown after a finished run ("terminate
    called without an active exception", SIGABRT: -6, or the launcher's exit with it, 250). Only stock's swappers
    make those handles: a run of tencache's ending so failed (helper-227; the bench's rule too)."""
    return returncode != 0 and "terminate called without an active exception" in output


def launch_ranks(script, args, ranks, cleanup=(), timeout=900, forked=False, stock=False):
    """``launch_two_ranks`` with ``ranks`` ranks; ``forked``: the ranks forked from the fork server as the launcher
    starts them (forkserver.py's ``launch_ranks``; the launcher itself with TENCACHE_TEST_FORKSERVER=0)."""
    port = free_port()
    args = [str(a) for a in args]
    command = ["deepspeed", "--num_gpus", str(ranks), "--master_port", str(port), script] + args
    env = dict(os.environ, PYTHONPATH=REPO)
    started = time.monotonic()
    try:
        if forked and _FORK_SERVER.enabled:
            with tempfile.TemporaryDirectory() as outputs:
                proc = _FORK_SERVER.run(args, env, timeout, os.path.join(outputs, "ranks"), command, script=script,
                                        ranks=ranks, master_port=port)
        else:
            proc = _run_in_own_group(command, env, timeout)
    finally:
        shm_buffers.remove_run_buffers(port)
        for folder in cleanup:
            shutil.rmtree(folder, ignore_errors=True)
        _log_run("helper", started, dict(script=os.path.basename(script), args=args, ranks=ranks,
                                         forked=forked and _FORK_SERVER.enabled))
    result = result_of(proc.stdout)
    output = proc.stdout[-2000:] + proc.stderr[-4000:]
    assert result is not None, output
    assert proc.returncode == 0 or stock and teardown_aborted(proc.returncode, proc.stdout + proc.stderr), output
    return result


# One stock launch of two ranks through DeepSpeed's launcher (about 40 s of the suite's CPU), memoised: the tests that
# need one share it (test_forkserver.py: forked ranks give its bits; test_shm_buffers.py: it leaves no buffer).
TWO_RANK_LAUNCH = dict(block=None, launcher="deepspeed", num_ranks=2, steps=2, seq_len=16, dtype="fp32",
                       label="two-rank-launch")


# Variables nothing reads at import: a run whose environment adds only these (and TENCACHE_*, which only tencache_ds
# reads, and the server never imports it) can be forked from the fork server, whose modules were imported without
# them. SLOW_MASTER_WRITES_S: read by the start-up hook slow_master_writes/sitecustomize.py, which a forked child runs
# before the run.
READ_AFTER_IMPORT = ("MASTER_PORT", "SLOW_MASTER_WRITES_S")


def read_after_import(extra_env) -> bool:
    """Whether every variable ``extra_env`` adds is read after import only (TENCACHE_* or READ_AFTER_IMPORT)."""
    return all(key.startswith("TENCACHE_") or key in READ_AFTER_IMPORT for key in extra_env)


def run_helper(script, args, timeout=600, env=None):
    """``python SCRIPT ARGS`` for a helper script beside the tests (one process; the repository on PYTHONPATH, ``env``
    added to this environment): forked from the fork server where it can be (``env`` adds only TENCACHE_* or
    READ_AFTER_IMPORT), about 5 s of start-up less a run, a fresh interpreter otherwise. Its CompletedProcess (a run
    that hangs past ``timeout`` is killed with its process group and fails the test); logged as a helper run."""
    args = [str(arg) for arg in args]
    extra = dict(env or {})
    command = [sys.executable, script] + args
    full_env = dict(os.environ, PYTHONPATH=REPO, **extra)
    forked = _FORK_SERVER.enabled and read_after_import(extra)
    started = time.monotonic()
    try:
        if forked:
            with tempfile.TemporaryDirectory() as outputs:
                return _FORK_SERVER.run(args, full_env, timeout, os.path.join(outputs, "run"), command, script=script)
        return _run_in_own_group(command, full_env, timeout)
    finally:
        _log_run("helper", started, dict(script=os.path.basename(script), args=args, ranks=1, forked=forked))


def scenarios_against_stock_cpu(script, scenarios, budgets, device, tmp_path):
    """Run the ``scenarios`` of a helper script that takes ``SCENARIOS stock|tencache=BUDGETS DEVICE NVME_DIR``
    (tensor_fragments.py, zero_scenarios.py) twice: stock CPU offload in a process that never imports tencache_ds,
    the reference, then tencache with ``device`` offload at each of ``budgets``, 2 ranks forked as the launcher
    starts them. Checks that each reference scenario ran and that tencache's result equals it at every budget;
    returns the reference, for the caller's own checks."""
    def launch(mode, offload):
        nvme = tmp_path / f"nvme-{mode}-{offload}"
        return launch_ranks(script, [",".join(scenarios), mode, offload, nvme], 2, cleanup=[nvme], forked=True,
                            stock=mode == "stock")

    reference = launch("stock", "cpu")
    ours = launch("tencache=" + ",".join(budgets), device)
    for name in scenarios:
        assert reference.get(name, {}).get("ok"), (name, reference.get(name))
        for budget in budgets:
            assert ours.get(f"{name}@{budget}") == reference[name], (name, budget, ours.get(f"{name}@{budget}"))
    return reference


def free_port():
    """A port nothing listens on now, for the launcher's rendezvous (test workers run launchers side by side)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _fail_hung(command, timeout, output):
    pytest.fail(f"hung: no end after {timeout} s: {' '.join(command)}\n{output[-3000:]}")


def _run_in_own_group(command, env, timeout):
    """subprocess.run in a process group of its own: a run that hangs past ``timeout`` is killed with every rank
    the launcher started (killing the launcher alone would leave them waiting in a collective)."""
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            _fail_hung(command, timeout, stdout + stderr)
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


class _ForkServer:
    """The client of forkserver.py, one server per test worker, started at its first run: ``run`` is
    _run_in_own_group's equivalent for a ``python scripts/train.py ARGS`` run, a helper script's, or the ranks of a
    ``deepspeed --num_gpus N`` launch (same CompletedProcess, the same kill of the whole group and test failure when
    it hangs), about 10 s faster a run (25 s of CPU a launch). TENCACHE_TEST_FORKSERVER=0 runs every training run in
    a fresh interpreter, and every launch through the launcher, instead."""

    def __init__(self):
        self.enabled = os.environ.get("TENCACHE_TEST_FORKSERVER", "1") != "0"
        self._proc = None
        self._pending = b""
        self._closer_registered = False

    def _start(self, env):
        self._pending = b""
        self._proc = subprocess.Popen([sys.executable, FORKSERVER], cwd=REPO, env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if not self._closer_registered:
            atexit.register(self.close)
            self._closer_registered = True
        if self._line(timeout=300) != b"READY":
            raise RuntimeError("tests/deepspeed/forkserver.py did not start (run it by hand to see why)")

    def _line(self, timeout):
        """The next line the server wrote, or None after ``timeout`` s. Read with os.read, not a buffered file:
        select would not see a line already buffered."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self._proc.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"tests/deepspeed/forkserver.py ended (exit {self._proc.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line

    def run(self, argv, env, timeout, output_stem, command, script=None, ranks=None, master_port=None, startup=None):
        """``command`` run by the server: train.py (or ``script``) with ``argv``; with ``ranks``, that many ranks
        of it as ``deepspeed --num_gpus RANKS --master_port MASTER_PORT`` starts them; ``startup``, a
        sitecustomize.py the run (each rank) runs first."""
        if self._proc is None or self._proc.poll() is not None:  # first run, or a server that died: a new one
            # with this environment, not the run's: a start-up hook's PYTHONPATH would load the hook into the
            # server itself (Python runs a sitecustomize.py at start-up), and every child after it would have it
            self._start(dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])))
        stdout, stderr = f"{output_stem}.stdout", f"{output_stem}.stderr"
        if ranks:
            env = dict(env, MASTER_PORT=str(master_port))
        request = {"argv": argv, "env": env, "stdout": stdout, "stderr": stderr, "script": script, "ranks": ranks,
                   "startup": startup}
        try:
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
            pid = json.loads(self._line(timeout=60))["pid"]
            ended = self._line(timeout)
            if ended is None:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:  # it ended just now: its end line is on its way
                    pass
                late = self._line(timeout=60)
                if late is None:
                    raise RuntimeError(f"tests/deepspeed/forkserver.py did not reap run {pid}")
            else:
                reply = json.loads(ended)
                if reply.get("pid") != pid or "returncode" not in reply:
                    raise RuntimeError(f"tests/deepspeed/forkserver.py: {ended!r} for run {pid}")
                try:  # whatever the run started and left behind (the launcher's pipe would have waited for it)
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:  # nothing left: the usual case
                    pass
        except BaseException:
            self._abandon()  # whatever was said is out of step now: the next run gets a new server
            raise
        with open(stdout) as out, open(stderr) as err:
            output = subprocess.CompletedProcess(command, None, out.read(), err.read())
        if ended is None:
            _fail_hung(command, timeout, output.stdout + output.stderr)
        output.returncode = reply["returncode"]
        return output

    def _abandon(self):
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._proc, self._pending = None, b""

    def close(self):
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(timeout=60)


_FORK_SERVER = _ForkServer()
_STOCK_RUNS = {}  # stock runs are deterministic: one per distinct command line serves every test that needs it


def _shared_stock_runs(tmp_path_factory):
    """The folder where a stock run's result is kept for every test worker of this session: pytest-xdist gives
    each worker a base folder of its own (``.../popen-gwN``) under one shared by the session."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / "stock-runs"
    folder.mkdir(exist_ok=True)
    return folder


def _memoized_across_workers(folder, key, run):
    """``run()``'s TrainRun for ``key``, run once per session whichever worker asks first; a worker asking
    meanwhile waits for it (a lock file per key) instead of running it too. Kept as JSON: a pickle would name this
    module's classes, which the session's other conftest modules shadow."""
    name = hashlib.sha256(key.encode()).hexdigest()[:20]
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = folder / f"{name}.json"
        if saved.exists():
            with open(saved) as handle:
                return TrainRun(**json.load(handle))
        result = run()
        with open(saved.with_suffix(".tmp"), "w") as handle:
            json.dump({"result": result.result, "output": result.output, "returncode": result.returncode,
                       "shm_leftovers": result.shm_leftovers}, handle)
        os.replace(saved.with_suffix(".tmp"), saved)  # whole or absent: a failed run leaves nothing to load
        return result


@pytest.fixture
def fork_server():
    """The fork server client of this test worker (tests/deepspeed/test_forkserver.py)."""
    return _FORK_SERVER


UNSHARE_MOUNTS = ["unshare", "--mount", "--propagation", "private"]


def unshare_mounts() -> bool:
    """May a run here mount a file system of its own (a /dev/shm of a container's size) in a mount namespace?"""
    try:
        return subprocess.run(UNSHARE_MOUNTS + ["sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture
def train(tmp_path_factory):
    """train(config="stock-nvme.json", block=None | dict, launcher="python" | "deepspeed" | "ranks", **options).

    ``launcher``: "python", one process (forked from the fork server where it can be); "deepspeed", the
    ``deepspeed --num_gpus NUM_RANKS`` command; "ranks", NUM_RANKS ranks started as that command starts them,
    forked from the fork server (the launcher's command where a run cannot be forked: a cgroup, a /dev/shm of its
    own, environment variables read at import: other than ``read_after_import`` allows, or a PYTHONPATH that is no
    start-up hook's folder). The families README.md lists keep a run through the launcher.

    ``block=None``: stock DeepSpeed in a process that never imports tencache_ds (train.py --untouched-stock: the
    parity reference; its result has no stats), unless ``plugin_imported=True`` (tencache_ds imported, no block).

    ``script``: another script taking train.py's arguments (a test helper around it); ``cgroup``: a memory cgroup
    folder the run starts in (the launcher and every rank with it); ``shm_size``: a /dev/shm of this size (tmpfs's
    ``size=``, e.g. "16m") in a mount namespace of the run's own, as a container caps it (``unshare_mounts`` says
    whether this machine allows it); ``env``: variables to add to its environment;
    ``timeout``: seconds before the run counts as hung (subprocess.TimeoutExpired fails the test)."""
    tmp_path = tmp_path_factory.mktemp("train")

    def run(config="stock-nvme.json", block=None, launcher="python", expect_failure=False, plugin_imported=False,
            **options):
        if block is None and not plugin_imported:
            options["untouched_stock"] = True
        # the final fp32 weights read a sub-group at a time (the same bytes as DeepSpeed's public per-parameter API,
        # which swaps the parameter's whole sub-group in for each parameter: 4 s of a 9 s gpt2-tiny run); the tests
        # that read them through the public API say so (test_parity.py, test_rank_agreement.py). Set before the
        # stock runs' memo key, which a test naming the default then shares.
        options.setdefault("weights_gather", "grouped")
        if block is not None:
            return _run(config, block, launcher, expect_failure, **options)
        memo_key = json.dumps([config, launcher, expect_failure, sorted(options.items())])
        if memo_key not in _STOCK_RUNS:
            _STOCK_RUNS[memo_key] = _memoized_across_workers(
                _shared_stock_runs(tmp_path_factory), memo_key,
                lambda: _run(config, block, launcher, expect_failure, **dict(options)))
        return _STOCK_RUNS[memo_key]

    def _run(config, block, launcher, expect_failure, **options):
        name = uuid.uuid4().hex[:8]
        result_file = tmp_path / f"{name}.json"
        own_nvme = "nvme_path" not in options
        nvme_path = options.pop("nvme_path", str(tmp_path / f"nvme-{name}"))
        args = ["--deepspeed_config", os.path.join(REPO, "configs", config),
                "--nvme-path", nvme_path,
                "--tencache-block", "none" if block is None else json.dumps(block),
                "--result-file", str(result_file)]
        options.setdefault("model", "gpt2-tiny")
        options.setdefault("steps", 3)
        num_ranks = options.pop("num_ranks", 1)
        script = options.pop("script", TRAIN)
        cgroup = options.pop("cgroup", None)
        shm_size = options.pop("shm_size", None)
        extra_env = dict(options.pop("env", {}))
        timeout = options.pop("timeout", 900)
        for key, value in options.items():
            if value is True:
                args.append(f"--{key.replace('_', '-')}")
            else:
                args += [f"--{key.replace('_', '-')}", str(value)]
        master_port = None  # a plain python run is one rank with no LOCAL_SIZE: DeepSpeed makes no shm buffer
        if launcher in ("deepspeed", "ranks"):
            master_port = free_port()
            command = ["deepspeed", "--num_gpus", str(num_ranks), "--master_port", str(master_port),
                       script] + args
        else:
            command = [sys.executable, script] + args
        if cgroup is not None:  # the shell moves itself into the cgroup, then becomes the command
            command = ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "sh"] + command
        if shm_size is not None:
            command = UNSHARE_MOUNTS + ["sh", "-c", f'mount -t tmpfs -o size={shm_size} tmpfs /dev/shm && exec "$@"',
                                        "sh"] + command
        # TENCACHE_DEBUG_CHECKS: the stores check their invariants after every call, as in tests/cache
        # an ``env`` PYTHONPATH goes first (a test's start-up hook: slow_master_writes/sitecustomize.py)
        first = [extra_env.pop("PYTHONPATH")] if "PYTHONPATH" in extra_env else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(first + [REPO, os.environ.get("PYTHONPATH", "")]),
                   **{"TENCACHE_DEBUG_CHECKS": "1", **extra_env})
        # Environment variables that only a run's own scripts read (train.py, its helpers, tencache_ds at import
        # in the child): a run adding any other goes through a fresh interpreter, since the fork server imported
        # torch, DeepSpeed and transformers with its own environment. A PYTHONPATH added is a start-up hook's
        # folder: the forked child runs its sitecustomize.py first, as a fresh interpreter does at start-up.
        startup = os.path.join(first[0], "sitecustomize.py") if first else None
        forkable = ((launcher == "python" and script == TRAIN or launcher == "ranks") and cgroup is None
                    and shm_size is None and _FORK_SERVER.enabled and read_after_import(extra_env)
                    and (startup is None or os.path.isfile(startup)))
        started = time.monotonic()
        try:
            if forkable:
                proc = _FORK_SERVER.run(args, env, timeout, tmp_path / name, command,
                                        script=None if script == TRAIN else script,
                                        ranks=num_ranks if launcher == "ranks" else None, master_port=master_port,
                                        startup=startup)
            else:
                proc = _run_in_own_group(command, env, timeout)
        finally:
            # A run killed before it could unlink its buffers (69 MB of RAM each) leaves them: remove this run's,
            # told from a concurrent run's by the master port.
            leftovers = shm_buffers.remove_run_buffers(master_port) if master_port is not None else []
            if own_nvme:  # a run's swap files are hundreds of MiB and nothing reads them after it: a whole suite
                shutil.rmtree(nvme_path, ignore_errors=True)  # of them would fill a CI disk
            _log_run("train", started, dict(options, config=config, stock=block is None, launcher=launcher,
                                            ranks=num_ranks, forked=forkable, script=os.path.basename(script)))
        output = proc.stdout + proc.stderr
        if expect_failure:
            assert proc.returncode != 0, output[-3000:]
            return TrainRun(None, output, proc.returncode, leftovers)
        # the result file is complete by the time of a stock run's teardown abort
        stock = block is None or block.get("enabled") is False
        assert proc.returncode == 0 or (stock and teardown_aborted(proc.returncode, output)
                                        and result_file.exists()), output[-5000:]
        with open(result_file) as handle:
            return TrainRun(json.load(handle), output, proc.returncode, leftovers, str(result_file))

    return run
