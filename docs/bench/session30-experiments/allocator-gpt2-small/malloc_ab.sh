#!/bin/bash
# A/B of allocator settings, fp32; args: MODEL CONFIG BLOCK
cd /work/main
MODEL=${MODEL:-gpt2-small}; CONFIG=${CONFIG:-configs/stock-nvme.json}; STEPS=${STEPS:-7}
BLOCK=${BLOCK:-'{"enabled": true, "host_cache_bytes": "auto"}'}
EXTRA=${EXTRA:-}
run() {
  label=$1; shift
  /usr/bin/time -f "maxrss_kb %M" env "$@" python3 scripts/train.py --deepspeed_config $CONFIG --model $MODEL --steps $STEPS \
    --micro-batch 2 --seq-len 64 --dtype fp32 --tencache-block "$BLOCK" $EXTRA \
    --nvme-path /tmp/malloc-ab-nvme > /tmp/malloc-ab/$label.$r.log 2>&1
  echo "$label $r: $(grep -E '^step' /tmp/malloc-ab/$label.$r.log | awk '{print $7}' | tr '\n' ' ') $(grep maxrss /tmp/malloc-ab/$label.$r.log) $(grep sha256 /tmp/malloc-ab/$label.$r.log | cut -c1-30)"
  rm -rf /tmp/malloc-ab-nvme
}
mkdir -p /tmp/malloc-ab
for r in 1 2; do
run base X=1
run nommap MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736
run thp THP_MEM_ALLOC_ENABLE=1
run hugetlb GLIBC_TUNABLES=glibc.malloc.hugetlb=1
done
