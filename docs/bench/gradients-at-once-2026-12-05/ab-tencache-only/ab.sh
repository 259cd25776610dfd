#!/bin/bash
# beyond RAM (gpt2-1.3b fp32 "auto", the bench's shape), tencache arm only: the code before (a worktree of HEAD,
# /tmp/wt-old) and after (/work/main), in the order given by ARMS (before-1 after-1 ...); peak RSS and steps.
OUT=${OUT:-/tmp/fp/ab}  # as run: ARMS="before-1 after-1" then ARMS="after-2 before-2", after git worktree add /tmp/wt-old <the commit before>
for arm in ${ARMS}; do
  tree=/work/main; [ "${arm%%-*}" = before ] && tree=/tmp/wt-old
  rm -rf /tmp/br-nvme; mkdir -p /tmp/br-nvme
  block="{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
  (cd $tree && MASTER_ADDR=127.0.0.1 MASTER_PORT=29546 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 PYTHONPATH=$tree python3 -u scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-6} --nvme-path /tmp/br-nvme --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  echo "$arm rc=$? $(date +%T)"
done
