#!/bin/bash
# Ad-hoc: tencache alone, the code before (BASE: a checkout at 70daddc) and with the change (NEW: a checkout at
# 2dff1d6), alternating, one process after another. OUT gets the logs, metrics and results. The defaults are the
# beyond-RAM model's runs of this folder:
#   BASE=/path/a NEW=/path/b OUT=/tmp/ab bash ab.sh
# and docs/bench/gpt2-small-many-sub-groups-quarter-2026-11-29/backward-reads-ahead/ was made with
#   MODEL=gpt2-small CONFIG=configs/stock-nvme-many-sub-groups.json BUDGET=620000000 STEPS=8 ROUNDS="1 2 3" ...
set -u
BASE=${BASE:?a checkout at 70daddc}; NEW=${NEW:?a checkout at 2dff1d6}; OUT=${OUT:-/tmp/ab}; NVME=${NVME:-/tmp/ab-nvme}
MODEL=${MODEL:-gpt2-1.3b}; CONFIG=${CONFIG:-configs/stock-nvme-beyond-ram.json}; BUDGET=${BUDGET:-\"auto\"}
STEPS=${STEPS:-6}; ROUNDS=${ROUNDS:-1 2}
mkdir -p "$OUT"
for round in $ROUNDS; do
  for arm in base new; do
    if [ $arm = base ]; then ROOT=$BASE; else ROOT=$NEW; fi
    rm -rf "$NVME"; mkdir -p "$NVME"
    rm -f /dev/shm/deepspeed_allreduce_buffer_* 2>/dev/null
    BLOCK="{\"enabled\": true, \"host_cache_bytes\": $BUDGET, \"device_cache_bytes\": \"auto\","
    BLOCK="$BLOCK \"metrics_path\": \"$OUT/$arm-$round.metrics.jsonl\"}"
    (cd "$ROOT" && python3 -m deepspeed.launcher.runner --num_gpus 1 scripts/train.py --deepspeed_config "$CONFIG" \
      --model "$MODEL" --steps "$STEPS" --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path "$NVME" \
      --tencache-block "$BLOCK" --weights-gather none --result-file "$OUT/$arm-$round.result.json" \
      > "$OUT/$arm-$round.log" 2>&1)
    echo "$arm-$round rc=$? $(date +%T)"
  done
done
