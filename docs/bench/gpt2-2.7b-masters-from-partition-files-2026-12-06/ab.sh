#!/bin/bash
# gpt2-2.7b beyond RAM, tencache "auto" alone, traced (wrap.py is ../phases-traced-2026-12-06/wrap.py, copied to
# $OUT first), trees in turn: the code before (ea07773, old-1, old-2), the change with each owed master filled at its
# swap-in (new-1, new-2), and with it read ahead from the partitions too (ra-1: the code committed):
#   PAIRS="new-1:/tmp/wt-new old-1:/tmp/wt-old new-2:/tmp/wt-new" STEPS=5 bash ab.sh
#   PAIRS="ra-1:/tmp/wt-ra old-2:/tmp/wt-old" STEPS=5 bash ab.sh
OUT=/tmp/trace27
for pair in ${PAIRS}; do
  arm=${pair%%:*}; tree=${pair#*:}
  rm -rf /tmp/br27; mkdir -p /tmp/br27
  block="{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
  (cd $tree && TRACE_OUT=$OUT/$arm.trace MASTER_ADDR=127.0.0.1 MASTER_PORT=29546 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python3 -u $OUT/wrap.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-2.7b --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-5} --nvme-path /tmp/br27 --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  rc=$?; rm -rf /tmp/br27  # 39 GB of swap files: the next run, or a bench, needs the room
  echo "$arm rc=$rc $(date +%T) $(grep TENCACHE $OUT/$arm.trace | head -1)"
done
