#!/bin/bash
# A/B at 2 ranks: old (34d0e4d, a worktree at /tmp/wt-old) vs new (the working tree), through `deepspeed --num_gpus 2`,
# tencache streaming gpt2-small fp32 with 37 optimizer sub-groups (configs/stock-nvme-many-sub-groups.json),
# micro-batch 1 x 32, alternating, 10 steps each; shapes as ab3.sh's "many" and "cpuopt" (the optimizer on the CPU).
OUT=${OUT:-/tmp/ab-update-reads/two-ranks}; mkdir -p $OUT
for rep in ${REPS:-1 2}; do
 for shape in ${SHAPES:-cpuopt many}; do
  for arm in old new; do
   tree=/work/main; [ $arm = old ] && tree=/tmp/wt-old
   extra=""; [ $shape = cpuopt ] && extra="--optimizer-offload-device cpu"
   rm -rf /tmp/ab-nvme; mkdir -p /tmp/ab-nvme
   tag=$shape-$arm-$rep
   block="{\"enabled\": true, \"host_cache_bytes\": 0, \"metrics_path\": \"$OUT/$tag.metrics.jsonl\"}"
   rm -f $OUT/$tag.metrics.jsonl*
   (cd $tree && PYTHONPATH=$tree deepspeed --num_gpus 2 --master_port $((29600 + rep)) scripts/train.py \
     --deepspeed_config configs/stock-nvme-many-sub-groups.json $extra --model gpt2-small --steps 10 --micro-batch 1 \
     --seq-len 32 --dtype fp32 --nvme-path /tmp/ab-nvme --weights-gather grouped --tencache-block "$block" \
     --result-file $OUT/$tag.result.json --label $tag > $OUT/$tag.log 2>&1)
   echo "$tag rc=$? $(date +%T)"
  done
 done
done
