#!/bin/bash
# A/B of the fp32 masters filled from the parameter partitions (2026-11-29, twenty-sixth session), back to back on one
# machine: "old" is 83713d8 (a git worktree at /tmp/wt-old, the native arena copied in), "new" the working tree of
# cf38cae before its last fix (partitions away on file were taken for another dtype, so copies were current only
# from the third step: steps 3-6 are the same code). gpt2-1.3b fp32 "auto", 6 steps; show.py prints the steps.
# Results: old.json, new.json (scripts/train.py result files).
set -e
for arm in old new; do
  if [ $arm = old ]; then ROOT=/tmp/wt-old; else ROOT=/work/main; fi
  rm -rf /tmp/tencache-bench-nvme/ab-$arm
  cd $ROOT
  python3 scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --steps 6 --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/tencache-bench-nvme/ab-$arm --tencache-block '{"enabled": true, "host_cache_bytes": "auto", "device_cache_bytes": "auto"}' --result-file /tmp/ab/$arm.json --label ab-$arm --weights-gather grouped > /tmp/ab/$arm.log 2>&1
  rm -rf /tmp/tencache-bench-nvme/ab-$arm
done
