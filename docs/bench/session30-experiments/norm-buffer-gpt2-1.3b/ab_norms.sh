#!/bin/bash
# A/B: tencache "auto" on gpt2-1.3b beyond RAM, the code before (604eb5f) and with the norm buffer, alternating;
# scripts/step_phases.py with detail, 6 steps (3 dropped)
set -u
OUT=${OUT:-/tmp/ab-norms}; mkdir -p $OUT
rm -rf /tmp/wt-before; git -C /work/main worktree add -f /tmp/wt-before 604eb5f -q
cp /work/main/tencache_ds/_tencache_arena*.so /tmp/wt-before/tencache_ds/
for r in 1 2; do for arm in before with; do
  dir=/work/main; [ $arm = before ] && dir=/tmp/wt-before
  rm -rf /tmp/ab-norms-nvme
  (cd $dir && STEP_PHASES_WARMUP=3 STEP_PHASES_DETAIL=1 /usr/bin/time -f "maxrss_kb %M" python3 scripts/step_phases.py $arm $OUT/$arm.$r.json -- \
    scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --steps 6 \
    --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/ab-norms-nvme \
    --tencache-block '{"enabled": true, "host_cache_bytes": "auto"}' > $OUT/$arm.$r.log 2>&1)
done; done
rm -rf /tmp/ab-norms-nvme
git -C /work/main worktree remove --force /tmp/wt-before; git -C /work/main worktree prune
echo done > $OUT/DONE
