#!/bin/bash
OUT=/tmp/trace/io4
mkdir -p $OUT
for arm in ${ARMS}; do
  case ${arm%%-*} in io4) cfg=/tmp/trace/beyond-ram-io4.json;; io2) cfg=configs/stock-nvme-beyond-ram.json;; esac
  rm -rf /tmp/br-nvme; mkdir -p /tmp/br-nvme
  block="{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
  (cd /work/main && NORM_SCRATCH=0 TRACE_OUT=$OUT/$arm.trace MASTER_ADDR=127.0.0.1 MASTER_PORT=29546 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python3 -u /tmp/trace/wrap.py --deepspeed_config $cfg --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-10} --nvme-path /tmp/br-nvme --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  echo "$arm rc=$? $(date +%T)"
done
