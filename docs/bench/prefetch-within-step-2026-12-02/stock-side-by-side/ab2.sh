#!/bin/bash
# stock side by side with tencache, at the code before (old) and after (new) c9529ff, alternating old/new benches
OUT=${OUT:-/tmp/ab2}; mkdir -p $OUT
for rep in 1 2; do
 for arm in old new; do
  cd /tmp/wt-$arm && PYTHONPATH=/tmp/wt-$arm python3 -c "from tencache_ds.cli.main import main; main()" bench --model gpt2-tiny --ranks 2 \
    --config configs/stock-nvme-many-sub-groups.json --host-cache-bytes 24MB --dtype fp32 --steps 8 --warmup 3 --repeats 1 \
    --nvme-bandwidth 1GB --no-plots --nvme-path /tmp/ab2-nvme-$arm --out $OUT/$arm-$rep > $OUT/$arm-$rep.txt 2>&1
  echo "$arm-$rep rc=$?"
 done
done
