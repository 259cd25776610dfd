#!/bin/bash
# tencache "auto" gpt2-small fp32: the fp32 weights gathered through DeepSpeed's public getter (safe_get_full_fp32_param
# per parameter) after 3 steps; f4a0c20 (a worktree at /tmp/wt: arms old*), the code before the change, against the working tree (arms new*)
OUT=${OUT:-/tmp/gab/out}; mkdir -p $OUT
for arm in ${ARMS:-old new new2 old2}; do
  tree=/work/main; case $arm in old*) tree=/tmp/wt;; esac
  rm -rf /tmp/gab-nvme; mkdir -p /tmp/gab-nvme
  (cd $tree && PYTHONPATH=$tree python -m deepspeed.launcher.runner --num_gpus 1 --master_port 29535 scripts/train.py --deepspeed_config configs/stock-nvme.json --model ${MODEL:-gpt2-small} --steps 3 --micro-batch 2 --seq-len 64 --dtype fp32 --nvme-path /tmp/gab-nvme --tencache-block '{"enabled": true, "host_cache_bytes": "auto"}' --result-file $OUT/$arm.result.json --label $arm --weights-gather public > $OUT/$arm.log 2>&1)
  echo "$arm rc=$? $(date +%T) $(python -c "import json; d=json.load(open('$OUT/$arm.result.json')); print(round(d['weights_gather_time_s'],2), d['weights_sha256'][:12], (d.get('stats_after_weights_gather') or {}).get('optimizer_fragment_swap_ins_without_gradient'))")"
done
