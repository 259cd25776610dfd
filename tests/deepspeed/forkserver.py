"""A fork server for the suite's training runs: imports what every run of scripts/train.py imports (torch,
DeepSpeed, transformers and the test models' modeling code, about 10 s of a 20 s gpt2-tiny run on 2 cores) once,
then forks one child per run, which runs train.py's ``main`` exactly as ``python scripts/train.py ARGS`` would (or a
helper script, as ``python SCRIPT ARGS`` would), with the run's own environment, its output in files, in a process
group of its own. A run of several ranks forks them as ``deepspeed --num_gpus N`` starts them (``launch_ranks``):
the launcher's own start-up and each rank's imports, about 25 s of CPU a launch, are saved.

What a child shares with a fresh process: everything train.py does, from parsing its arguments on (seeding, the
model, ``deepspeed.initialize``, tencache_ds's import when the run is not --untouched-stock: the server never
imports tencache_ds, so a stock reference is still a process that never did). What differs: the modules are
already imported, with the server's environment (conftest sends only runs whose environment adds nothing that is
read at import time; a start-up hook's sitecustomize.py, which a fresh interpreter runs first, the child runs before
the run), and py-cpuinfo's answer is already cached (train.py caches it for the process anyway).

Protocol, one JSON object per line: requests on stdin ``{"argv": [...], "env": {...}, "stdout": path, "stderr":
path}``, optionally with ``"script": path`` (another script than train.py), ``"ranks": N`` (the env then holds
MASTER_PORT) and ``"startup": path`` (a start-up hook, a sitecustomize.py, run in the child first); on stdout,
``READY`` once, then per request ``{"pid": N}`` when the child started and ``{"pid": N, "returncode": R}`` when it
ended (R as subprocess reports it: negative for a signal). EOF on stdin ends the server.
"""
import atexit
import ctypes
import importlib
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
# The protocol keeps the stdout it was given; everything else printed here (DeepSpeed logs to stdout at import)
# goes to stderr.
REPLY = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)

import train  # noqa: E402  (torch, deepspeed; py-cpuinfo cached for the process)

LIBC = ctypes.CDLL(None)
TEST_MODELS = ("gpt2-tiny", "opt-tiny", "llama-tiny", "bloom-tiny", "falcon-tiny")


def prepare():
    for name in TEST_MODELS:
        train.preimport_model_code(train.load_model_config(name)[1])
    try:
        import cpuinfo
        cpuinfo.get_cpu_info()  # train.py made it ask once per process: the children find the answer
    except ImportError:
        pass
    # deepspeed.initialize's optimizer check (zero/utils.py is_zero_supported_optimizer) imports DeepSpeed's Muon,
    # whose torch.compile decorators import torch._dynamo and inductor: 2.4 s of every run on an Intel Xeon's 2
    # cores. Imported here once; it starts no thread and draws nothing from the random generators.
    try:
        importlib.import_module("deepspeed.runtime.zero.muon.muon_optimizer")
    except ImportError:  # as stock's check tolerates it: the run then finds it missing as a fresh one would
        pass
    if "tencache_ds" in sys.modules:  # a stock reference must be a process that never imported it
        raise SystemExit("forkserver.py: tencache_ds was imported before any run; stock references would carry it")


def run_child(request) -> int:
    """In the child: become the run the request names, with its environment and output files: train.py, or the
    request's ``script``, with its arguments; with ``ranks``, the ranks DeepSpeed's launcher would start
    (``launch_ranks``)."""
    os.setsid()  # its own process group: a hung run is killed with whatever it started
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.environ.clear()
    os.environ.update(request["env"])
    if request.get("ranks"):
        return launch_ranks(request["ranks"], request.get("script"), request["argv"], request.get("startup"))
    return run_script(request.get("script"), request["argv"], request.get("startup"))


def run_script(script, argv, startup=None) -> int:
    """train.py's ``main`` with ``argv`` (``script`` None), or ``script`` run as ``__main__`` with it, as
    ``python SCRIPT ARGV`` would run it; its exit status. ``startup``: a sitecustomize.py run first, as a fresh
    interpreter runs the one on its PYTHONPATH at start-up (before it imports tencache_ds, which the server never
    did: a hook that patches it on import patches it here too)."""
    sys.argv = [script or train.__file__] + argv
    code = 0
    try:
        if startup is not None:
            runpy.run_path(startup, run_name="sitecustomize")
        if script is None:
            code = train.main(argv) or 0
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # the interpreter's sys.path[0]
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if isinstance(stop.code, int):
            code = stop.code
        elif stop.code is not None:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # as the interpreter would: the traceback, exit status 1
        traceback.print_exc()
        code = 1
    try:  # what the interpreter does at exit, which os._exit skips: join the non-daemon threads, run atexit
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        LIBC.fflush(None)  # C++ output (DeepSpeed's aio errors) buffered in stdio
    return code


def launch_ranks(ranks, script, argv, startup=None) -> int:
    """What ``deepspeed --num_gpus RANKS --master_port PORT SCRIPT ARGV`` does on one node (DeepSpeed's
    launcher/runner.py and launch.py; PORT from the request's MASTER_PORT): a rank per process, each with the
    environment the launcher sets and ``--local_rank=i`` before the script's arguments, all writing to the same
    output files (stdout line-buffered, where the launcher runs ``python -u``: a line is one write, so the ranks'
    lines do not interleave within a line). When a rank fails the launcher ends the others (SIGTERM, SIGKILL after
    30 s) and its exit status is that rank's."""
    launched = {"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": str(ranks), "CROSS_RANK": "0", "CROSS_SIZE": "1",
                "LOCAL_SIZE": str(ranks), "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(ranks)))}
    live = []
    for rank in range(ranks):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ.update(launched, RANK=str(rank), LOCAL_RANK=str(rank))
                # a line is written when it ends, in one write: with write-through on (python -u, PYTHONUNBUFFERED),
                # print's text and its newline were two writes, and another rank's line could land between them
                sys.stdout.reconfigure(line_buffering=True, write_through=False)
                code = run_script(script, [f"--local_rank={rank}"] + argv, startup)
            finally:
                os._exit(code)
        live.append(pid)
    code, kill_at = 0, None
    while live:
        pid, status = os.waitpid(-1, 0 if kill_at is None else os.WNOHANG)  # blocks until a rank has failed
        if pid == 0:
            if time.monotonic() > kill_at:
                for other in live:
                    os.kill(other, signal.SIGKILL)
                kill_at = float("inf")
            time.sleep(0.05)
            continue
        live.remove(pid)
        returncode = os.waitstatus_to_exitcode(status)
        if returncode != 0 and code == 0:
            code, kill_at = returncode, time.monotonic() + 30
            for other in live:
                os.kill(other, signal.SIGTERM)
    return code


def serve():
    prepare()
    reply = REPLY
    reply.write("READY\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        LIBC.fflush(None)  # nothing buffered here may be written again by a child
        pid = os.fork()
        if pid == 0:
            reply.close()
            code = 1
            try:
                code = run_child(request)
            finally:
                os._exit(code)
        reply.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        reply.write(json.dumps({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    serve()
