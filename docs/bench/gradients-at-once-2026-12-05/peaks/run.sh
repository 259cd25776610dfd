#!/bin/bash
# tencache's peak RSS with each gradient partitioned at once (the code in /work/main), the configurations the step
# model's tests pin; one run each, one rank, fp32.
OUT=${OUT:-/tmp/fp/peaks}  # as run: bash run.sh (from any folder; it runs /work/main)
cd /work/main
run() {  # label model config budget micro seq steps
  rm -rf /tmp/fp/nvme-p; mkdir -p /tmp/fp/nvme-p
  block="{\"enabled\": true, \"host_cache_bytes\": $4}"
  MASTER_ADDR=127.0.0.1 MASTER_PORT=29545 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 PYTHONPATH=/work/main \
    python3 -u scripts/train.py --deepspeed_config $3 --model $2 --dtype fp32 --micro-batch $5 --seq-len $6 \
    --steps $7 --nvme-path /tmp/fp/nvme-p --weights-gather none --tencache-block "$block" \
    --result-file $OUT/$1.result.json > $OUT/$1.log 2>&1
  echo "$1 rc=$? $(date +%T) peak $(python3 -c "import json;r=json.load(open('$OUT/$1.result.json'));print(round(max(s['peak_rss_bytes'] for s in r['steps'])/2**30,3), 'GiB; at-once', r['steps'][-1]['stats'].get('gradients_partitioned_at_once'))")"
}
run small-0 gpt2-small configs/stock-nvme.json 0 2 64 6
run small-auto gpt2-small configs/stock-nvme.json '"auto"' 2 64 6
run medium-0 gpt2-medium configs/stock-nvme-large-vocab.json 0 2 64 6
run medium-auto gpt2-medium configs/stock-nvme-large-vocab.json '"auto"' 2 64 6
run small-many-620 gpt2-small configs/stock-nvme-many-sub-groups.json '"620MB"' 1 32 5
run medium-many-620 gpt2-medium configs/stock-nvme-many-sub-groups.json '"620MB"' 1 32 5
