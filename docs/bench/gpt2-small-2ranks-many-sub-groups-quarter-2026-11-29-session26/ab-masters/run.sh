#!/bin/bash
# A/B at 2 ranks, gpt2-small fp32, 37 sub-groups, 310 MB a rank: the code before the masters' fill (83713d8, a
# worktree at /tmp/wt-old) and with it (/work/main), alternating, 7 steps each
set -e
for round in 1 2; do
for arm in old new; do
  if [ $arm = old ]; then ROOT=/tmp/wt-old; else ROOT=/work/main; fi
  rm -rf /tmp/tencache-bench-nvme/ab2
  cd $ROOT
  python3 -m deepspeed.launcher.runner --num_gpus 2 --master_port 4419$round scripts/train.py --deepspeed_config configs/stock-nvme-many-sub-groups.json --model gpt2-small --steps 7 --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/tencache-bench-nvme/ab2 --tencache-block '{"enabled": true, "host_cache_bytes": 310000000, "device_cache_bytes": "auto"}' --result-file /tmp/ab2/$arm-$round.json --label $arm --weights-gather grouped > /tmp/ab2/$arm-$round.log 2>&1
done; done
rm -rf /tmp/tencache-bench-nvme/ab2
