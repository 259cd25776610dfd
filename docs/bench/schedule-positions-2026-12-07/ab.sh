#!/bin/bash
# A/B of the schedule's reads ahead over passed positions: old (HEAD, /tmp/wt-old) vs new (/work/main working tree)
mkdir -p /tmp/ab
for round in 1 2; do
  for arm in old new; do
    root=/work/main; [ $arm = old ] && root=/tmp/wt-old
    rm -rf /tmp/ab-nvme
    (cd $root && PYTHONPATH=$root timeout 900 python scripts/train.py --deepspeed_config configs/tencache-stream.json \
      --model gpt2-small --dtype fp32 --seq-len 32 --micro-batch 1 --steps 6 --nvme-path /tmp/ab-nvme \
      --result-file /tmp/ab/$arm-$round.json > /tmp/ab/$arm-$round.log 2>&1)
    echo "$arm $round rc=$?"
  done
done
