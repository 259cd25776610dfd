#!/bin/bash
cd /work/main
OUT=/tmp/br2; ARM=gather-public; STEPS=${STEPS:-3}
rm -rf /tmp/br2-nvme && mkdir -p /tmp/br2-nvme
python docs/bench/gpt2-1.3b-2ranks-2026-12-05/rss_sampler.py "$OUT/$ARM.rss.jsonl" &
SAMPLER=$!
python scripts/in_memory_cgroup.py --limit machine -- python -m deepspeed.launcher.runner --num_gpus 2 \
    scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 \
    --seq-len 32 --micro-batch 1 --steps "$STEPS" --nvme-path /tmp/br2-nvme \
    --tencache-block "{\"enabled\": true, \"metrics_path\": \"$OUT/$ARM.metrics.jsonl\"}" \
    --result-file $OUT/$ARM.result.json --label "$ARM" 2>&1 | while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N | cut -c1-14)" "$l"; done \
    > "$OUT/$ARM.out"
echo "exit ${PIPESTATUS[0]}" >> "$OUT/$ARM.out"
kill $SAMPLER
rm -rf /tmp/br2-nvme
