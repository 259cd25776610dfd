#!/bin/bash
# A/B: old (a worktree at /tmp/wt-old of 36e2f84, before the cache-core review fixes put store()/write_parts' fills under the store lock) vs new (b846e26), tencache 620MB gpt2-small many sub-groups, alternating
OUT=${OUT:-/tmp/ab-lock}; mkdir -p $OUT
for rep in 1 2 3; do
 for arm in old new; do
  tree=/work/main; [ $arm = old ] && tree=/tmp/wt-old
  rm -rf /tmp/ab-nvme; mkdir -p /tmp/ab-nvme
  block="{\"enabled\": true, \"host_cache_bytes\": \"620MB\", \"metrics_path\": \"$OUT/$arm-$rep.metrics.jsonl\"}"
  rm -f $OUT/$arm-$rep.metrics.jsonl
  (cd $tree && MASTER_ADDR=127.0.0.1 MASTER_PORT=0 PYTHONPATH=$tree python3 -u scripts/train.py --deepspeed_config configs/stock-nvme-many-sub-groups.json --model gpt2-small --steps 10 --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/ab-nvme --tencache-block "$block" --result-file $OUT/$arm-$rep.result.json --label $arm-$rep > $OUT/$arm-$rep.log 2>&1)
  echo "$arm-$rep rc=$?"
 done
done
