"""Run a command in a memory cgroup of its own, so that if it needs more memory than the limit, the kernel's OOM
killer ends that command and nothing else on the machine; then say how it ended (exit code, or killed, and the
cgroup's OOM-kill count and peak usage) and remove the cgroup. Used by scripts/bench_beyond_ram.sh to show what
stock CPU offload does with a model larger than the machine's memory.

    python scripts/in_memory_cgroup.py --limit machine|BYTES [--log FILE] -- COMMAND ...

``machine``: the machine's physical memory (MemTotal). Needs root and a writable cgroup file system with the memory
controller (v1 or v2). Exits with the command's exit code (137 when it was killed).
"""
import argparse
import os
import signal
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tencache_ds.probes.host_memory import memory_cgroup_folder, read_host_memory  # noqa: E402
from tencache_ds.units import fmt_bytes, parse_bytes  # noqa: E402


def _read(folder, name):
    try:
        with open(os.path.join(folder, name)) as handle:
            return handle.read()
    except OSError:
        return ""


def _oom_kills(folder, version):
    text = _read(folder, "memory.oom_control" if version == 1 else "memory.events")
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return None


def _die_with_parent():
    """In the child before exec: SIGKILL it when this script dies (a caller's timeout kills the script; the command
    must not go on running in a cgroup nobody removes)."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", required=True, help='"machine" or a size, e.g. 20GB')
    parser.add_argument("--log", default=None, help="also write the command's output and the verdict here")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    parent, _root, version = memory_cgroup_folder()
    if parent is None:
        raise SystemExit("in_memory_cgroup.py: this process sees no memory cgroup (cgroup file system not mounted)")
    limit = read_host_memory().total_bytes if args.limit == "machine" else parse_bytes(args.limit)
    folder = os.path.join(parent, f"tencache-run-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    os.mkdir(folder)
    try:
        with open(os.path.join(folder, "memory.limit_in_bytes" if version == 1 else "memory.max"), "w") as handle:
            handle.write(str(limit))
        log = open(args.log, "w") if args.log else None
        started = time.time()
        process = subprocess.Popen(["sh", "-c", f'echo $$ > "{folder}/cgroup.procs" && exec "$@"', "sh"] + command,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   preexec_fn=_die_with_parent)
        for line in process.stdout:
            sys.stdout.write(line)
            if log:
                log.write(line)
        code = process.wait()
        peak = _read(folder, "memory.max_usage_in_bytes" if version == 1 else "memory.peak").strip()
        kills = _oom_kills(folder, version)
        verdict = (f"[in_memory_cgroup] limit {fmt_bytes(limit)} ({args.limit}); after {time.time() - started:.0f} s "
                   f"the command {'was killed by signal %d' % -code if code < 0 else 'exited with %d' % code}; "
                   f"OOM kills in its cgroup: {kills}; peak usage {fmt_bytes(int(peak)) if peak else 'unknown'}")
        print(verdict)
        if log:
            log.write(verdict + "\n")
            log.close()
        return 128 - code if code < 0 else code
    finally:
        for _attempt in range(100):
            try:
                os.rmdir(folder)
                break
            except OSError:
                time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
