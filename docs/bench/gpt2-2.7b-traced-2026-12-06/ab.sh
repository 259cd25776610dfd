#!/bin/bash
# wrap.py is ../phases-traced-2026-12-06/wrap.py, copied to $OUT (/tmp/trace27) first; the old tree at 2e00b10 (old-1, old-2),
# the new one the change (new-1: a first version that took only unchanged partitions' buffers; new-2: 35549ce; new-3:
# 00bfdfd, whose acquire() change 0403049 reverted), in the order new-1, old-1, new-2, then 40 minutes later new-3, old-2
# gpt2-2.7b beyond RAM, tencache "auto" alone, traced (wrap.py), two trees in turn:
#   PAIRS="new-1:/tmp/wt-new old-1:/work/main" STEPS=5 bash ab.sh
OUT=/tmp/trace27
for pair in ${PAIRS}; do
  arm=${pair%%:*}; tree=${pair#*:}
  rm -rf /tmp/br27; mkdir -p /tmp/br27
  block="{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
  (cd $tree && TRACE_OUT=$OUT/$arm.trace MASTER_ADDR=127.0.0.1 MASTER_PORT=29546 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python3 -u $OUT/wrap.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-2.7b --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-5} --nvme-path /tmp/br27 --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  rc=$?; rm -rf /tmp/br27  # 39 GB of swap files: the next run, or a bench, needs the room
  echo "$arm rc=$rc $(date +%T) $(grep TENCACHE $OUT/$arm.trace | head -1)"
done
