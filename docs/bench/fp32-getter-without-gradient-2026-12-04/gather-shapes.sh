#!/bin/bash
# The public fp32 gather (safe_get_full_fp32_param per parameter, after 3 steps, gpt2-small fp32) beside stock NVMe
# and beyond the first shape: ARM=stock (no tencache block), old (f4a0c20, the code before, a worktree at /tmp/wt),
# new (the working tree); CONFIG, HOST (host_cache_bytes), RANKS. Result files: $OUT/$NAME.result.json
#   NAME=stock ARM=stock bash gather-shapes.sh
#   NAME=many-quarter-old ARM=old CONFIG=configs/stock-nvme-many-sub-groups.json HOST=620MB MB=1 SEQ=32 bash gather-shapes.sh
#   NAME=ranks2-old ARM=old RANKS=2 bash gather-shapes.sh
OUT=${OUT:-/tmp/gab/shapes}; mkdir -p $OUT
tree=/work/main; [ "$ARM" = old ] && tree=/tmp/wt
block="{\"enabled\": true, \"host_cache_bytes\": \"${HOST:-auto}\"}"; [ "$ARM" = stock ] && block=none
[ "${HOST:-auto}" != auto ] && block="{\"enabled\": true, \"host_cache_bytes\": \"$HOST\"}"
[ "$ARM" = stock ] && block=none
rm -rf /tmp/gab-nvme; mkdir -p /tmp/gab-nvme
(cd $tree && PYTHONPATH=$tree python -m deepspeed.launcher.runner --num_gpus ${RANKS:-1} --master_port 29536 scripts/train.py \
  --deepspeed_config ${CONFIG:-configs/stock-nvme.json} --model gpt2-small --steps 3 --micro-batch ${MB:-2} \
  --seq-len ${SEQ:-64} --dtype fp32 --nvme-path /tmp/gab-nvme --tencache-block "$block" \
  --result-file $OUT/$NAME.result.json --label $NAME --weights-gather public > $OUT/$NAME.log 2>&1)
echo "$NAME rc=$? $(python -c "import json; d=json.load(open('$OUT/$NAME.result.json')); print(round(d['weights_gather_time_s'],2), d['weights_sha256'][:12], (d.get('stats_after_weights_gather') or {}).get('optimizer_fragment_swap_ins_without_gradient'))")"
