#!/bin/bash
# A/B: old (34d0e4d, a worktree at /tmp/wt-old) vs new (the working tree: the next step's first parameter reads
# started during the optimizer step, at most buffer_count - 1 of them), tencache streaming gpt2-small fp32,
# alternating, 10 steps each; three shapes:
#   one: configs/stock-nvme.json (one optimizer sub-group), micro-batch 2 x 64
#   many: configs/stock-nvme-many-sub-groups.json (37 sub-groups), micro-batch 1 x 32
#   cpuopt: as many, with the optimizer on the CPU (--optimizer-offload-device cpu): the update is CPU Adam
OUT=${OUT:-/tmp/ab-update-reads/bounded}; mkdir -p $OUT
for rep in 1 2 3; do
 for shape in cpuopt many one; do
  for arm in old new; do
   tree=/work/main; [ $arm = old ] && tree=/tmp/wt-old
   extra=""
   case $shape in
    one) cfg=configs/stock-nvme.json; mb=2; seq=64;;
    many) cfg=configs/stock-nvme-many-sub-groups.json; mb=1; seq=32;;
    cpuopt) cfg=configs/stock-nvme-many-sub-groups.json; mb=1; seq=32; extra="--optimizer-offload-device cpu";;
   esac
   rm -rf /tmp/ab-nvme; mkdir -p /tmp/ab-nvme
   tag=$shape-$arm-$rep
   block="{\"enabled\": true, \"host_cache_bytes\": 0, \"metrics_path\": \"$OUT/$tag.metrics.jsonl\"}"
   rm -f $OUT/$tag.metrics.jsonl
   (cd $tree && MASTER_ADDR=127.0.0.1 MASTER_PORT=0 PYTHONPATH=$tree python3 -u scripts/train.py --deepspeed_config $cfg $extra --model gpt2-small --steps 10 --micro-batch $mb --seq-len $seq --dtype fp32 --nvme-path /tmp/ab-nvme --weights-gather grouped --tencache-block "$block" --result-file $OUT/$tag.result.json --label $tag > $OUT/$tag.log 2>&1)
   echo "$tag rc=$? $(date +%T)"
  done
 done
done
