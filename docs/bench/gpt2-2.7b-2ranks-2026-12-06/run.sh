#!/bin/bash
# gpt2-2.7b fp32 at 2 ranks on this 23.5 GiB machine (twice its RAM), tencache "auto", in a memory cgroup as large as
# the machine, both ranks' RSS sampled every 0.5 s (the rss_sampler.py of docs/bench/gpt2-1.3b-2ranks-2026-12-05; the
# run of 2026-12-06 used a copy of it in this folder, since removed).
# No bit reference can run here (stock NVMe was OOM-killed at 2 ranks already on gpt2-1.3b; stock CPU offload is at
# one rank on gpt2-2.7b). The weights are not hashed (--weights-gather none). Run from the repository's root.
OUT=$(cd "$(dirname "$0")" && pwd); ARM=${ARM:-auto}; STEPS=${STEPS:-3}
rm -rf /tmp/br2-nvme && mkdir -p /tmp/br2-nvme
python "$OUT/../gpt2-1.3b-2ranks-2026-12-05/rss_sampler.py" "$OUT/$ARM.rss.jsonl" &
SAMPLER=$!
python scripts/in_memory_cgroup.py --limit machine -- python -m deepspeed.launcher.runner --num_gpus 2 \
    scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram-2.7b.json --model gpt2-2.7b --dtype fp32 \
    --seq-len 32 --micro-batch 1 --steps "$STEPS" --nvme-path /tmp/br2-nvme --weights-gather none \
    --tencache-block "{\"enabled\": true, \"metrics_path\": \"$OUT/$ARM.metrics.jsonl\"}" \
    --result-file "$OUT/$ARM.result.json" --label "$ARM" 2>&1 \
    | while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N | cut -c1-14)" "$l"; done > "$OUT/$ARM.out"
echo "exit ${PIPESTATUS[0]}" >> "$OUT/$ARM.out"
kill $SAMPLER
rm -rf /tmp/br2-nvme
