#!/bin/bash
# beyond-RAM, tencache "auto" only: ea5a891 (a worktree at /tmp/wt-old: arms named old*) against 29d12e8, the change
# tried and reverted (/work/main then: the other arms), one run per arm, in the order given. The two pairs here:
#   ARMS="old new new2 old2" OUT=/tmp/br-ab bash ab-beyond-ram.sh
OUT=${OUT:-/tmp/br-ab}
for arm in ${ARMS:-old new}; do
  tree=/work/main; case $arm in old*) tree=/tmp/wt-old;; esac
  rm -rf /tmp/br-nvme; mkdir -p /tmp/br-nvme
  block="{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
  (cd $tree && MASTER_ADDR=127.0.0.1 MASTER_PORT=29544 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 PYTHONPATH=$tree python3 -u scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 --steps 5 --nvme-path /tmp/br-nvme --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  echo "$arm rc=$? $(date +%T)"
done
