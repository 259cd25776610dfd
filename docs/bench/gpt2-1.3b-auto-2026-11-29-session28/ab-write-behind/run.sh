#!/usr/bin/env bash
# A/B of the masters written behind (2e88e0f) against the code before it (eb71a15), tencache "auto" only,
# gpt2-1.3b fp32 beyond RAM, back to back, alternating, twice. Each arm in its own checkout; results here.
set -euo pipefail
OUT=$(cd "$(dirname "$0")" && pwd)
BEFORE=${BEFORE:-/tmp/wt-prev}   # git worktree add /tmp/wt-prev eb71a15 (plus the built arena .so)
AFTER=${AFTER:-$(cd "$OUT/../../../.." && pwd)}
NVME=/tmp/tencache-bench-nvme
for round in 1 2; do
  for arm in before after; do
    dir=$BEFORE; [ $arm = after ] && dir=$AFTER
    rm -rf $NVME
    (cd $dir && deepspeed --num_gpus 1 scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json \
      --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 --steps 6 --nvme-path $NVME \
      --weights-gather grouped --result-file "$OUT/$arm-$round.result.json" \
      --tencache-block "{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"device_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm-$round.metrics.jsonl\"}" \
      > "$OUT/$arm-$round.log" 2>&1)
  done
done
rm -rf $NVME
