#!/bin/bash
# gpt2-1.3b beyond RAM, the tencache arm ("auto") alone, 7 steps, with torch's huge pages for its CPU allocations
# (THP_MEM_ALLOC_ENABLE=1, "thp") and without ("plain"); run as ARMS="thp-1 plain-1 plain-2 thp-2" bash huge_pages_ab.sh from
# anywhere (it runs /work/main's scripts/train.py); summary: huge_pages_ab.json
OUT=${OUT:-/tmp/thp}
for arm in ${ARMS}; do
  case ${arm%%-*} in thp) env=1;; plain) env=0;; esac
  rm -rf /tmp/br-nvme; mkdir -p /tmp/br-nvme
  block="{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
  (cd /work/main && THP_MEM_ALLOC_ENABLE=$env MASTER_ADDR=127.0.0.1 MASTER_PORT=29546 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python3 -u scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-7} --nvme-path /tmp/br-nvme --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  echo "$arm rc=$? $(date +%T)"
done
rm -rf /tmp/br-nvme
