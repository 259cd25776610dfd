#!/bin/bash
# gpt2-1.3b fp32 at 2 ranks on this 23.5 GiB machine (beyond its RAM), each run in a memory cgroup as large as the
# machine, both ranks' RSS sampled every 0.5 s. ARM: the label; TENCACHE: the tencache block, or "none" for stock
# NVMe. The four arms of docs/reliability.md ("Two ranks beyond RAM") were run with the code before the change
# (before), with gradients partitioned at once at 2 ranks only (at-once-only), with both changes
# (at-once-and-step-rise), and stock (stock-nvme: TENCACHE=none EXTRA="--untouched-stock --weights-gather none").
# The tencache arms' final weights hash (--weights-gather public, the default) was OOM-killed after the last step
# at 2 ranks until scripts/train.py hashed the weights one at a time (8e2e264, the seventy-third session): the arm
# gather-public is that code, run by gather-public.sh (this script's launch with 3 steps and a result file, its
# outputs written to /tmp/br2 and copied here).
cd "$(dirname "$0")/../../.."
ARM=${ARM:-at-once-and-step-rise}; OUT=$(dirname "$0"); STEPS=${STEPS:-6}
TENCACHE=${TENCACHE:-"{\"enabled\": true, \"metrics_path\": \"$OUT/$ARM.metrics.jsonl\"}"}
rm -rf /tmp/br2-nvme && mkdir -p /tmp/br2-nvme
python "$OUT/rss_sampler.py" "$OUT/$ARM.rss.jsonl" &
python scripts/in_memory_cgroup.py --limit machine -- python -m deepspeed.launcher.runner --num_gpus 2 \
    scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 \
    --seq-len 32 --micro-batch 1 --steps "$STEPS" --nvme-path /tmp/br2-nvme --tencache-block "$TENCACHE" $EXTRA \
    --label "$ARM" 2>&1 | while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N | cut -c1-14)" "$l"; done \
    > "$OUT/$ARM.out"
