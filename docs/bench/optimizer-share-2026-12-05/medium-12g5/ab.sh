#!/bin/bash
# gpt2-medium fp32, beyond-RAM config (sub_group_size 1e8: 4 sub-groups), in a memory cgroup of LIMIT: "auto"
# (grows its optimizer share into what the steps leave free, part of the state) against host_cache_bytes SMALL
# (the parameter cache whole, little optimizer state, no growth). Tencache arm only.
OUT=/tmp/probe/medium; LIMIT=${LIMIT:-11GiB}; SMALL=${SMALL:-1500000000}
for arm in ${ARMS}; do
  case ${arm%%-*} in auto) hb='"auto"';; small) hb=$SMALL;; esac
  rm -rf /tmp/md-nvme; mkdir -p /tmp/md-nvme
  block="{\"enabled\": true, \"host_cache_bytes\": $hb, \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
  rm -f $OUT/$arm.metrics.jsonl
  (cd /work/main && MASTER_ADDR=127.0.0.1 MASTER_PORT=29546 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python3 scripts/in_memory_cgroup.py --limit $LIMIT -- python3 -u scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-medium --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-8} --nvme-path /tmp/md-nvme --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  echo "$arm rc=$? $(date +%T)"
done
