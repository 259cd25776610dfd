#!/usr/bin/env bash
# The issue-7 benchmark set: GPT-2 at ~15M, 124M and 350M parameters, each in three host budgets ("auto", 25% of
# the offloaded bytes, 0 = streaming), stock and tencache interleaved (plus stock CPU offload where --compare cpu).
# Results go to $OUT/<model>-<mode>/ (OUT: docs/bench unless set; the set of 2026-12-04 is in docs/bench/sizes-2026-12-04,
# OUT=docs/bench/sizes-2026-12-04); docs/benchmarks.md has the table. 25 to 60 minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
NVME=${NVME:-/tmp/tencache-bench-nvme}
OUT=${OUT:-docs/bench}
run() { echo "== $*"; tencache-ds bench --nvme-path "$NVME" "$@"; }
# gpt2-small (124M): 2 repeats; offloaded bytes 2.24 GB (bf16 params 0.25 GB + optimizer 1.99 GB): 25% = 560 MB
run --model gpt2-small --steps 6 --warmup 2 --repeats 2 --compare cpu --out $OUT/gpt2-small-auto
run --model gpt2-small --steps 6 --warmup 2 --repeats 2 --compare cpu --host-cache-bytes 560MB --out $OUT/gpt2-small-quarter
run --model gpt2-small --steps 6 --warmup 2 --repeats 2 --host-cache-bytes 0 --out $OUT/gpt2-small-stream
# gpt2-tiny (15M): offloaded 0.27 GB: 25% = 68 MB
run --model gpt2-tiny --steps 6 --warmup 2 --repeats 2 --compare cpu --out $OUT/gpt2-tiny-auto
run --model gpt2-tiny --steps 6 --warmup 2 --repeats 2 --compare cpu --host-cache-bytes 68MB --out $OUT/gpt2-tiny-quarter
run --model gpt2-tiny --steps 6 --warmup 2 --repeats 2 --host-cache-bytes 0 --out $OUT/gpt2-tiny-stream
# gpt2-medium (355M): its embedding (51.5M elements) needs stock's buffer_size raised to 6e7; offloaded 6.4 GB: 25% = 1.6 GB
LARGE=(--model gpt2-medium --config configs/stock-nvme-large-vocab.json --steps 5 --warmup 2 --repeats 1)
run "${LARGE[@]}" --compare cpu --out $OUT/gpt2-medium-auto
run "${LARGE[@]}" --compare cpu --host-cache-bytes 1600MB --out $OUT/gpt2-medium-quarter
run "${LARGE[@]}" --host-cache-bytes 0 --out $OUT/gpt2-medium-stream
