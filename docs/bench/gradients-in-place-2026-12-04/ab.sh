#!/bin/bash
# tencache arm only, the benches' command: ea5a891 in a worktree at /tmp/wt-old (arms old*) against 29d12e8, the
# change tried and reverted (/work/main then: arms new*), one run per arm and shape, in the order given:
#   OUT=... SHAPES="small-auto small-stream medium-auto medium-stream" ARMS="old new new old" bash ab.sh
# (Each run's label inside its result counts the files before it, -0 or -3; the files here are named by pair, -1 to
# -4: the first set ran old-new-new-old, pairs 1 and 2; the second new-old-old-new, pairs 3 and 4.)
OUT=... SHAPES="small-auto small-stream medium-auto medium-stream" ARMS="old new new old" bash ab.sh
OUT=${OUT:-/tmp/ab/out}; mkdir -p $OUT
for shape in ${SHAPES:-small-auto small-stream medium-auto}; do
  case $shape in
    small-auto) model=gpt2-small; cfg=configs/stock-nvme.json; host='"auto"';;
    small-stream) model=gpt2-small; cfg=configs/stock-nvme.json; host=0;;
    medium-auto) model=gpt2-medium; cfg=configs/stock-nvme-large-vocab.json; host='"auto"';;
    medium-stream) model=gpt2-medium; cfg=configs/stock-nvme-large-vocab.json; host=0;;
  esac
  for arm in ${ARMS:-old new new old}; do
    tree=/work/main; case $arm in old*) tree=/tmp/wt-old;; esac
    n=$(ls $OUT | grep -c "^$shape-$arm") ; name=$shape-$arm-$n
    rm -rf /tmp/ab-nvme; mkdir -p /tmp/ab-nvme
    block="{\"enabled\": true, \"host_cache_bytes\": $host, \"device_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$name.metrics.jsonl\"}"
    (cd $tree && PYTHONPATH=$tree python -m deepspeed.launcher.runner --num_gpus 1 --master_port 29533 scripts/train.py --deepspeed_config $cfg --model $model --steps 9 --micro-batch 2 --seq-len 64 --dtype fp32 --nvme-path /tmp/ab-nvme --tencache-block "$block" --result-file $OUT/$name.result.json --label $name --weights-gather grouped > $OUT/$name.log 2>&1)
    echo "$name rc=$? $(date +%T)"
  done
done
