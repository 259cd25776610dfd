#!/bin/bash
# beyond-RAM, tencache "auto" only, the I/O engine's request order per arm (TENCACHE_IO_ORDER=arm name before '-'),
# with reads-first.patch applied to /work/main (fifo: the engine as committed). As run on 2026-12-04:
#   ARMS="fifo-1 reads_first-1 reads_first-2 fifo-2" OUT=/tmp/ab bash ab.sh
OUT=${OUT:-/tmp/ab}
for arm in ${ARMS}; do
  order=${arm%%-*}
  rm -rf /tmp/br-nvme; mkdir -p /tmp/br-nvme
  block="{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
  (cd /work/main && TENCACHE_IO_ORDER=$order MASTER_ADDR=127.0.0.1 MASTER_PORT=29544 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 PYTHONPATH=/work/main python3 -u scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-6} --nvme-path /tmp/br-nvme --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  echo "$arm rc=$? $(date +%T)"
done
