#!/bin/bash
# A/B of the moments kept before the filled masters (2026-11-29, twenty-seventh session), back to back on one machine:
# "old" is 627d6f5 (a git worktree at /tmp/wt-old, the native arena copied in), "new" the working tree with the change;
# alternating old new old new; gpt2-1.3b fp32 "auto", 6 steps each. show.py prints the steps. Results: ARM.json.
set -e
for arm in old new old2 new2; do
  case $arm in old*) ROOT=/tmp/wt-old;; *) ROOT=/work/main;; esac
  rm -rf /tmp/tencache-bench-nvme/ab-$arm
  cd $ROOT
  python3 scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --steps 6 --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/tencache-bench-nvme/ab-$arm --tencache-block '{"enabled": true, "host_cache_bytes": "auto", "device_cache_bytes": "auto"}' --result-file /tmp/ab/$arm.json --label ab-$arm --weights-gather grouped > /tmp/ab/$arm.log 2>&1
  rm -rf /tmp/tencache-bench-nvme/ab-$arm
done
