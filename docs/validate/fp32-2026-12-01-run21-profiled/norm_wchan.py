"""The forty-fourth session (docs/estimate.md, after run 21): run a training script in this process and, while stage
3's clipping norms run (_constant_buffered_norm2), sample the training thread's state and wait channel every ~0.5
ms, and which other threads are running then; printed at exit (lines "NORMWCHAN"). Under the launcher:
deepspeed --num_gpus 1 norm_wchan.py scripts/train.py --deepspeed_config configs/stock-nvme.json --model gpt2-small \\
    --steps 5 --micro-batch 2 --seq-len 64 --dtype fp32 --nvme-path DIR --tencache-block none|JSON"""
import atexit, collections, os, runpy, sys, threading, time
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path[:0] = [REPO, os.path.join(REPO, "scripts")]
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3
phase = [None]
states, others, wall = collections.Counter(), collections.Counter(), collections.Counter()


def timed(name):
    original = getattr(Stage3, name)

    def wrapper(self, *args, **kwargs):
        before, phase[0], started = phase[0], name, time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            wall[name] += time.perf_counter() - started
            phase[0] = before
    setattr(Stage3, name, wrapper)


timed("_constant_buffered_norm2")
main_tid = threading.get_native_id()


def thread_state(tid):
    with open(f"/proc/self/task/{tid}/stat") as handle:
        stat = handle.read()
    return stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]


def sample():
    own = threading.get_native_id()
    while True:
        now = phase[0]
        if now:
            try:
                _, state = thread_state(main_tid)
                with open(f"/proc/self/task/{main_tid}/wchan") as handle:
                    channel = handle.read().strip() if state != "R" else "-"
                states[(now, state, channel)] += 1
                for tid in os.listdir("/proc/self/task"):
                    if int(tid) not in (main_tid, own):
                        name, other = thread_state(tid)
                        others[(now, name)] += other == "R"
            except OSError:
                pass
        time.sleep(0.0005)


def report():
    print("NORMWCHAN wall", dict(wall))
    for key, count in states.most_common(25):
        print("NORMWCHAN training thread", count, key)
    for key, count in others.most_common(15):
        print("NORMWCHAN other threads running", count, key)


threading.Thread(target=sample, daemon=True).start()
atexit.register(report)
sys.argv = [arg for arg in sys.argv[1:] if not arg.startswith("--local_rank")]
runpy.run_path(sys.argv[0], run_name="__main__")
