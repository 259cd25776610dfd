#!/usr/bin/env bash
# The regime NVMe offload exists for (issue 15): a model whose fp32 parameters plus optimizer state exceed this
# machine's memory. gpt2-1.3b (1.28 B parameters) in fp32: 5.1 GB of parameters + 20.4 GB of Adam state, on a
# 23.5 GiB machine. First stock CPU offload, in a memory cgroup as large as the machine (so that the kernel's OOM
# killer, if it comes, ends that run only); then stock ZeRO-Infinity (NVMe) and tencache "auto", interleaved.
# Results: docs/bench/gpt2-1.3b-auto/ (and stock-cpu.log there). About 20 minutes; needs ~30 GB free on --nvme-path.
# MODEL=gpt2-2.7b CONFIG=configs/stock-nvme-beyond-ram-2.7b.json: the 2.6 B model (10.4 GB of parameters + 41.6 GB of Adam
# state, twice this machine's RAM; its embedding needs buffer_size 8.2e7), ~50 GB free; STEPS=7 WARMUP=4 measure
# it once its parameter profile predicts (from the fifth step), about 25 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
NVME=${NVME:-/tmp/tencache-bench-nvme}
MODEL=${MODEL:-gpt2-1.3b}
CONFIG=${CONFIG:-configs/stock-nvme-beyond-ram.json}
OUT=${OUT:-docs/bench/$MODEL-auto}
SHAPE=(--model "$MODEL" --dtype fp32 --seq-len 32 --micro-batch 1)
mkdir -p "$OUT"
if [ "${SKIP_STOCK_CPU:-0}" != 1 ]; then
    python scripts/in_memory_cgroup.py --limit machine --log "$OUT/stock-cpu.log" -- \
        python scripts/train.py --deepspeed_config "$CONFIG" "${SHAPE[@]}" --steps 2 \
        --offload-device cpu --optimizer-offload-device cpu --stage3-defaults --untouched-stock || true
fi
tencache-ds bench "${SHAPE[@]}" --config "$CONFIG" --steps "${STEPS:-5}" --warmup "${WARMUP:-3}" --repeats 1 \
    --nvme-path "$NVME" --out "$OUT"
