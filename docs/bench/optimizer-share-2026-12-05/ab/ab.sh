#!/bin/bash
# beyond RAM (gpt2-1.3b fp32, the bench shape), tencache arm only: "auto" against host_cache_bytes 4.2e9 (the
# parameter cache whole, the optimizer share ~39 MB); as run: ARMS="auto-1 small-1 small-2 auto-2", STEPS 7
OUT=/tmp/probe/ab; mkdir -p $OUT
for arm in ${ARMS}; do
  case ${arm%%-*} in auto) hb='"auto"';; small) hb=4200000000;; esac
  rm -rf /tmp/br-nvme; mkdir -p /tmp/br-nvme
  block="{\"enabled\": true, \"host_cache_bytes\": $hb, \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
  (cd /work/main && MASTER_ADDR=127.0.0.1 MASTER_PORT=29546 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python3 -u scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-7} --nvme-path /tmp/br-nvme --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  echo "$arm rc=$? $(date +%T)"
done
