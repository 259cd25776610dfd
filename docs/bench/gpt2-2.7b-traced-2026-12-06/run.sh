#!/bin/bash
# wrap.py is ../phases-traced-2026-12-06/wrap.py, copied to $OUT (/tmp/trace27) first (the code of 2e00b10)
# gpt2-2.7b, tencache "auto" alone, traced (wrap.py): ARMS="auto-1" STEPS=5 bash run.sh
OUT=/tmp/trace27
for arm in ${ARMS}; do
  rm -rf /tmp/br27; mkdir -p /tmp/br27
  block="{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
  (cd ${TREE:-/work/main} && TRACE_OUT=$OUT/$arm.trace MASTER_ADDR=127.0.0.1 MASTER_PORT=29546 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python3 -u $OUT/wrap.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-2.7b --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-5} --nvme-path /tmp/br27 --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  rc=$?; rm -rf /tmp/br27  # 39 GB of swap files: the next run, or a bench, needs the room
  echo "$arm rc=$rc $(date +%T)"
done
