#!/bin/bash
# A/B as ab.sh, third shape: the optimizer on the CPU (--optimizer-offload-device cpu), the parameters streaming
# from NVMe, 37 optimizer sub-groups (configs/stock-nvme-many-sub-groups.json), micro-batch 1 x 32: the update is
# CPU Adam with the drive idle, where the next step's first reads can start during it.
OUT=${OUT:-/tmp/ab-update-reads}; mkdir -p $OUT
for rep in 1 2 3; do
 for arm in old new; do
  tree=/work/main; [ $arm = old ] && tree=/tmp/wt-old
  rm -rf /tmp/ab-nvme; mkdir -p /tmp/ab-nvme
  tag=cpuopt-$arm-$rep
  block="{\"enabled\": true, \"host_cache_bytes\": 0, \"metrics_path\": \"$OUT/$tag.metrics.jsonl\"}"
  rm -f $OUT/$tag.metrics.jsonl
  (cd $tree && MASTER_ADDR=127.0.0.1 MASTER_PORT=0 PYTHONPATH=$tree python3 -u scripts/train.py --deepspeed_config configs/stock-nvme-many-sub-groups.json --optimizer-offload-device cpu --model gpt2-small --steps 10 --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/ab-nvme --tencache-block "$block" --result-file $OUT/$tag.result.json --label $tag > $OUT/$tag.log 2>&1)
  echo "$tag rc=$? $(date +%T)"
 done
done
