#!/usr/bin/env bash
# A/B of the masters written behind (HEAD) against the code before it (eb71a15, a worktree at BEFORE), tencache at
# 620 MB only, gpt2-small fp32 with 37 optimizer sub-groups, back to back, alternating, twice.
set -euo pipefail
OUT=$(cd "$(dirname "$0")" && pwd)
BEFORE=${BEFORE:-/tmp/wt-prev}
AFTER=${AFTER:-$(cd "$OUT/../../../.." && pwd)}
NVME=/tmp/tencache-bench-nvme
for round in 1 2; do
  for arm in before after; do
    dir=$BEFORE; [ $arm = after ] && dir=$AFTER
    rm -rf $NVME
    (cd $dir && deepspeed --num_gpus 1 scripts/train.py --deepspeed_config configs/stock-nvme-many-sub-groups.json \
      --model gpt2-small --dtype fp32 --seq-len 32 --micro-batch 1 --steps 9 --nvme-path $NVME \
      --weights-gather grouped --result-file "$OUT/$arm-$round.result.json" \
      --tencache-block "{\"enabled\": true, \"host_cache_bytes\": 620000000, \"device_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm-$round.metrics.jsonl\"}" \
      > "$OUT/$arm-$round.log" 2>&1)
  done
done
rm -rf $NVME
