#!/bin/bash
OUT=/tmp/rs-big
while pgrep -f "rs_wrap.py scripts/step_phases.py views" > /dev/null; do sleep 5; done
rm -rf /tmp/wt-base; git -C /work/main worktree add -f /tmp/wt-base afa7875 -q
cp /work/main/tencache_ds/_tencache_arena*.so /tmp/wt-base/tencache_ds/
rm -rf /tmp/rs-big-nvme
(cd /tmp/wt-base && RS_MODE=base STEP_PHASES_WARMUP=3 STEP_PHASES_DETAIL=1 /usr/bin/time -f "maxrss_kb %M" python3 /tmp/rs_wrap.py scripts/step_phases.py base $OUT/base.1.json -- \
    scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --steps 6 \
    --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/rs-big-nvme \
    --tencache-block '{"enabled": true, "host_cache_bytes": "auto"}' > $OUT/base.1.log 2>&1)
rm -rf /tmp/rs-big-nvme
git -C /work/main worktree remove --force /tmp/wt-base; git -C /work/main worktree prune
echo done > $OUT/DONE
