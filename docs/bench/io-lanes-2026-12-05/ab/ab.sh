#!/bin/bash
# beyond RAM (gpt2-1.3b fp32), tencache arm only: I/O order fifo vs mix (a read beside a write), "auto" and 4.2e9
# The fifo arms ran the engine with first-come order through an experiment variable (TENCACHE_IO_ORDER=fifo) that
# the measured code had and the commit does not; "mix" is the committed order. Run from /tmp/ab2 as measured.
OUT=/tmp/ab2; mkdir -p $OUT
for arm in ${ARMS}; do
  budget=${arm%%-*}; order=$(echo $arm | cut -d- -f2)
  case $budget in auto) hb='"auto"';; small) hb=4200000000;; esac
  rm -rf /tmp/br-nvme; mkdir -p /tmp/br-nvme
  block="{\"enabled\": true, \"host_cache_bytes\": $hb, \"metrics_path\": \"$OUT/$arm.metrics.jsonl\"}"
  (cd /work/main && TENCACHE_IO_ORDER=$order MASTER_ADDR=127.0.0.1 MASTER_PORT=29546 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python3 -u scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 --steps ${STEPS:-7} --nvme-path /tmp/br-nvme --weights-gather none --tencache-block "$block" --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  echo "$arm rc=$? $(date +%T)"
done
