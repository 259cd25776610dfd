#!/bin/bash
# arm name: old-N (HEAD in /tmp/wt-old) or new-N (/work/main working tree); "auto", 6 steps, traced
OUT=/tmp/wp; arm=$1; case $arm in old*) SRC=/tmp/wt-old;; *) SRC=/work/main;; esac
rm -rf /tmp/br-nvme; mkdir -p /tmp/br-nvme
block="{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
cd $SRC && PYTHONPATH=$SRC WAIT_PROBE_OUT=$OUT/$arm.waits.json MASTER_ADDR=127.0.0.1 MASTER_PORT=29546 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python3 -u /tmp/wp/wait_probe.py scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-6} --nvme-path /tmp/br-nvme --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1
echo "$arm rc=$? $(date +%T)"
