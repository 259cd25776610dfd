#!/bin/bash
while [ ! -f /tmp/ab-norms/DONE ]; do sleep 10; done
OUT=/tmp/ab-norms
for r in 1; do
  rm -rf /tmp/heap-nvme
  (cd /work/main && STEP_PHASES_WARMUP=3 STEP_PHASES_DETAIL=1 /usr/bin/time -f "maxrss_kb %M" python3 /tmp/heap_wrap.py scripts/step_phases.py heap $OUT/heap.$r.json -- \
    scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --steps 6 \
    --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/heap-nvme \
    --tencache-block '{"enabled": true, "host_cache_bytes": "auto"}' > $OUT/heap.$r.log 2>&1)
done
rm -rf /tmp/heap-nvme
echo done > $OUT/HEAPDONE
