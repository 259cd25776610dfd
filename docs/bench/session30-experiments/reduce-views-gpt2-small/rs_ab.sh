#!/bin/bash
cd /work/main
MODEL=${MODEL:-gpt2-small}; CONFIG=${CONFIG:-configs/stock-nvme.json}; STEPS=${STEPS:-7}; MB=${MB:-2}; SEQ=${SEQ:-64}
BLOCK=${BLOCK:-'{"enabled": true, "host_cache_bytes": "auto"}'}
OUTD=${OUTD:-/tmp/rs-ab}; MODES=${MODES:-"base views"}; ROUNDS=${ROUNDS:-"1 2"}
mkdir -p $OUTD
for r in $ROUNDS; do for m in $MODES; do
  rm -rf /tmp/rs-ab-nvme
  RS_MODE=$m /usr/bin/time -f "maxrss_kb %M" python3 /tmp/rs_wrap.py scripts/train.py --deepspeed_config $CONFIG --model $MODEL --steps $STEPS \
    --micro-batch $MB --seq-len $SEQ --dtype fp32 --tencache-block "$BLOCK" \
    --nvme-path /tmp/rs-ab-nvme > $OUTD/$m.$r.log 2>&1
done; done
rm -rf /tmp/rs-ab-nvme
