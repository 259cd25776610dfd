#!/bin/bash
# A/B: old (the commit before "Parameter reads ahead are planned within their own step", a worktree at /tmp/wt-old) vs new (that commit) tencache streaming gpt2-small, alternating
OUT=/tmp/ab-prefetch; mkdir -p $OUT
for rep in 1 2 3 4; do
 for arm in old new; do
  tree=/work/main; [ $arm = old ] && tree=/tmp/wt-old
  rm -rf /tmp/ab-nvme; mkdir -p /tmp/ab-nvme
  block="{\"enabled\": true, \"host_cache_bytes\": 0, \"metrics_path\": \"$OUT/$arm-$rep.metrics.jsonl\"}"
  rm -f $OUT/$arm-$rep.metrics.jsonl
  (cd $tree && MASTER_ADDR=127.0.0.1 MASTER_PORT=0 PYTHONPATH=$tree python3 -u scripts/train.py --deepspeed_config configs/stock-nvme.json --model gpt2-small --steps 10 --micro-batch 2 --seq-len 64 --dtype fp32 --nvme-path /tmp/ab-nvme --tencache-block "$block" --result-file $OUT/$arm-$rep.result.json --label $arm-$rep > $OUT/$arm-$rep.log 2>&1)
  echo "$arm-$rep rc=$?"
 done
done
