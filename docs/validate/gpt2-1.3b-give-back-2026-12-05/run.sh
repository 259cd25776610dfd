#!/bin/bash
# gpt2-1.3b fp32 beyond-RAM config, "auto", in a memory cgroup of LIMIT: does the run give back what the step
# model's governor gives back on a machine of that memory?
OUT=/tmp/probe/big; LIMIT=${LIMIT:-17.3GiB}; arm=${ARM:-auto-17g3}
rm -rf /tmp/bg-nvme; mkdir -p /tmp/bg-nvme
block="{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
rm -f $OUT/$arm.metrics.jsonl
cd /work/main && MASTER_ADDR=127.0.0.1 MASTER_PORT=29547 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python3 scripts/in_memory_cgroup.py --limit $LIMIT -- python3 -u scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-6} --nvme-path /tmp/bg-nvme --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1
echo "$arm rc=$? $(date +%T)"
