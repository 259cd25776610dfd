#!/bin/bash
# Ad-hoc: tencache beyond-RAM, base (HEAD) vs new (working tree), alternating, 6 steps each.
set -u
OUT=/tmp/trace/ab; mkdir -p $OUT
for round in 1 2; do
  for arm in base new; do
    if [ $arm = base ]; then ROOT=<checkout at 70daddc>; else ROOT=<checkout with the change>; fi
    rm -rf /tmp/trace/nvme-ab; mkdir -p /tmp/trace/nvme-ab
    rm -f /dev/shm/deepspeed_allreduce_buffer_* 2>/dev/null
    cd $ROOT
    python3 -m deepspeed.launcher.runner --num_gpus 1 scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json \
      --model gpt2-1.3b --steps 6 --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/trace/nvme-ab \
      --tencache-block "{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"device_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm-$round.metrics.jsonl\"}" \
      --weights-gather none --result-file $OUT/$arm-$round.result.json > $OUT/$arm-$round.log 2>&1
    echo "$arm-$round rc=$? $(date +%T)"
  done
done
