#!/bin/bash
# A/B: old (34d0e4d, a worktree at /tmp/wt-old) vs new (the working tree: the next step's first parameter reads
# started during the optimizer step), tencache streaming gpt2-small fp32, alternating; two shapes:
#   one: configs/stock-nvme.json (one optimizer sub-group), micro-batch 2 x 64
#   many: configs/stock-nvme-many-sub-groups.json (37 sub-groups), micro-batch 1 x 32
OUT=${OUT:-/tmp/ab-update-reads}; mkdir -p $OUT
for rep in 1 2 3; do
 for shape in many one; do
  for arm in old new; do
   tree=/work/main; [ $arm = old ] && tree=/tmp/wt-old
   if [ $shape = one ]; then cfg=configs/stock-nvme.json; mb=2; seq=64; else cfg=configs/stock-nvme-many-sub-groups.json; mb=1; seq=32; fi
   rm -rf /tmp/ab-nvme; mkdir -p /tmp/ab-nvme
   tag=$shape-$arm-$rep
   block="{\"enabled\": true, \"host_cache_bytes\": 0, \"metrics_path\": \"$OUT/$tag.metrics.jsonl\"}"
   rm -f $OUT/$tag.metrics.jsonl
   (cd $tree && MASTER_ADDR=127.0.0.1 MASTER_PORT=0 PYTHONPATH=$tree python3 -u scripts/train.py --deepspeed_config $cfg --model gpt2-small --steps 10 --micro-batch $mb --seq-len $seq --dtype fp32 --nvme-path /tmp/ab-nvme --tencache-block "$block" --result-file $OUT/$tag.result.json --label $tag > $OUT/$tag.log 2>&1)
   echo "$tag rc=$? $(date +%T)"
  done
 done
done
