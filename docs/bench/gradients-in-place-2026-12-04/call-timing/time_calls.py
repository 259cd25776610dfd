"""Time stage 3's step(), CPU Adam's step(), forward, backward and parts of them per training step (one line per step
in PROBE_LOG), then run scripts/train.py with the arguments given (gpt2-medium "auto", fp32, 2 x 64 here:
PROBE_LOG=OUT.log MASTER_ADDR=127.0.0.1 MASTER_PORT=29512 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python time_calls.py
scripts/train.py --deepspeed_config configs/stock-nvme-large-vocab.json --model gpt2-medium --steps 7 --micro-batch 2
--seq-len 64 --dtype fp32 --nvme-path DIR --tencache-block '{"enabled": true, "host_cache_bytes": "auto"}'
--result-file R.json --label x --weights-gather none)."""
import runpy, sys, time, os, collections
import tencache_ds  # noqa
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as S3
from deepspeed.ops.adam import DeepSpeedCPUAdam
T = collections.defaultdict(float)
log = open(os.environ["PROBE_LOG"], "w")
def timed(cls, name, key):
    orig = getattr(cls, name)
    def f(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            T[key] += time.perf_counter() - t
            if key == "s3_step":
                print(" ".join(f"{k} {v:.3f}" for k, v in sorted(T.items())), file=log, flush=True); T.clear()
    setattr(cls, name, f)
timed(DeepSpeedCPUAdam, "step", "adam")
timed(S3, "backward", "backward")
timed(S3, "unscale_and_clip_grads", "unscale")
timed(S3, "_optimizer_states_and_gradient_swap_in", "swap_in")
timed(S3, "_optimizer_states_and_gradient_swap_out", "swap_out")
timed(S3, "_reassign_or_swap_out_partitioned_parameters", "reassign")
timed(S3, "step", "s3_step")
from deepspeed.runtime.engine import DeepSpeedEngine as E
timed(E, "forward", "fwd")
timed(E, "backward", "bwd")
timed(S3, "independent_gradient_partition_epilogue", "epilogue")
timed(S3, "partition_grads", "partition_grads")
timed(S3, "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads", "reduce_ipg")
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
