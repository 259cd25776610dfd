#!/bin/bash
# One run of the beyond-RAM shape with rss_probe.py: RSS every 0.25 s; at each new maximum (+32 MiB) the main
# thread's stack, glibc's mallinfo2 and, after RSS_PROBE_SMAPS_AFTER seconds, the mappings over 50 MiB resident.
# r1: tencache "auto"; r2: the same with malloc_trim(0) before each backward (RSS_PROBE_TRIM=1); s1: stock (no
# --tencache-block), 5 steps.
OUT=${OUT:-/tmp/probe/r1}; mkdir -p $OUT; rm -rf /tmp/br-nvme; mkdir -p /tmp/br-nvme
block="{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"metrics_path\": \"$OUT/m.jsonl\"}"
MASTER_ADDR=127.0.0.1 MASTER_PORT=29546 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 RSS_PROBE_SMAPS_AFTER=120 \
  RSS_PROBE_OUT=$OUT/rss.json python3 -u docs/bench/optimizer-share-2026-12-05/rss-probe/rss_probe.py scripts/train.py \
  --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 \
  --steps 6 --nvme-path /tmp/br-nvme --weights-gather none --tencache-block "$block" --result-file $OUT/result.json \
  --label t > $OUT/log 2>&1
