#!/bin/bash
OUT=/tmp/rs-big; mkdir -p $OUT
for r in 1; do for m in views base; do
  rm -rf /tmp/rs-big-nvme
  (cd /work/main && RS_MODE=$m STEP_PHASES_WARMUP=3 STEP_PHASES_DETAIL=1 /usr/bin/time -f "maxrss_kb %M" python3 /tmp/rs_wrap.py scripts/step_phases.py $m $OUT/$m.$r.json -- \
    scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --steps 6 \
    --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/rs-big-nvme \
    --tencache-block '{"enabled": true, "host_cache_bytes": "auto"}' > $OUT/$m.$r.log 2>&1)
done; done
rm -rf /tmp/rs-big-nvme; echo done > $OUT/DONE
