#!/usr/bin/env bash
# The regime NVMe offload exists for (issue 15): a model whose fp32 parameters plus optimizer state exceed this
# machine's memory. gpt2-1.3b (1.28 B parameters) in fp32: 5.1 GB of parameters + 20.4 GB of Adam state, on a
# 23.5 GiB machine. First stock CPU offload, in a memory cgroup as large as the machine (so that the kernel's OOM
# killer, if it comes, ends that run only); then stock ZeRO-Infinity (NVMe) and tencache "auto", interleaved.
# Results: docs/bench/gpt2-1.3b-auto/ (and stock-cpu.log there). About 20 minutes; needs ~30 GB free on --nvme-path.
set -euo pipefail
cd "$(dirname "$0")/.."
NVME=${NVME:-/tmp/tencache-bench-nvme}
OUT=${OUT:-docs/bench/gpt2-1.3b-auto}
SHAPE=(--model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1)
mkdir -p "$OUT"
if [ "${SKIP_STOCK_CPU:-0}" != 1 ]; then
    python scripts/in_memory_cgroup.py --limit machine --log "$OUT/stock-cpu.log" -- \
        python scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json "${SHAPE[@]}" --steps 2 \
        --offload-device cpu --optimizer-offload-device cpu --stage3-defaults --untouched-stock || true
fi
tencache-ds bench "${SHAPE[@]}" --config configs/stock-nvme-beyond-ram.json --steps 5 --warmup 3 --repeats 1 \
    --nvme-path "$NVME" --out "$OUT"
