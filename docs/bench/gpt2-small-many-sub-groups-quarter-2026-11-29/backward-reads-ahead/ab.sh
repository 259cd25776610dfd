#!/bin/bash
# Ad-hoc: tencache gpt2-small fp32, 37 sub-groups, 620 MB: base (70daddc) vs new, alternating, 8 steps each.
set -u
OUT=/tmp/trace/ab2; mkdir -p $OUT
for round in 1 2 3; do
  for arm in base new; do
    if [ $arm = base ]; then ROOT=<checkout at 70daddc>; else ROOT=<checkout with the change>; fi
    rm -rf /tmp/trace/nvme-ab2; mkdir -p /tmp/trace/nvme-ab2
    cd $ROOT
    python3 -m deepspeed.launcher.runner --num_gpus 1 scripts/train.py --deepspeed_config configs/stock-nvme-many-sub-groups.json \
      --model gpt2-small --steps 8 --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/trace/nvme-ab2 \
      --tencache-block "{\"enabled\": true, \"host_cache_bytes\": 620000000, \"device_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm-$round.metrics.jsonl\"}" \
      --weights-gather none --result-file $OUT/$arm-$round.result.json > $OUT/$arm-$round.log 2>&1
    echo "$arm-$round rc=$? $(date +%T)"
  done
done
