#!/usr/bin/env bash
# Everything a 15-minute GPU lease is for, in one device call (docs/gpu_check.md): set up, the host-copy probe
# (scripts/host_copy_probe.py), gpu_check.sh without its bench, the same-knobs bench (tencache "auto" vs stock CPU
# offload, DeepSpeed's default stage-3 knobs, gpt2-small), then the host time per phase of both arms' steps
# (scripts/step_phases.py), each part bounded so that the results are packed before the call's limit.
#   here:  bash scripts/gpu_setup.sh --prepare            # wheels and libaio into .gpu/
#   there: bash scripts/gpu_lease.sh                      # device run, carry [".gpu"], timeout_s 600
# Writes $OUT/gc.tgz (every log, result, metrics file and profile), plus gpu_check.md and bench.md beside it.
# Options: --budget-s N (seconds the whole script may take, default 570), --model NAME (the bench's, gpt2-small).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=570
MODEL=gpt2-small
while [ $# -gt 0 ]; do
  case "$1" in
    --budget-s) BUDGET=$2; shift ;;
    --model) MODEL=$2; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "gpu_lease.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-lease-out}
G=$PWD/gc
mkdir -p "$G" "$OUT"
pack() {
  rm -rf "$G/nvme"
  cp "$G/gpu_check.md" "$G/bench-defaults/bench.md" "$OUT/" 2>/dev/null
  tar czf "$OUT/gc.tgz" gc
}
left() {  # seconds left of the budget, less $1, at least 1 (timeout 0 would mean no limit)
  local s=$((BUDGET - SECONDS - ${1:-0}))
  echo $((s < 1 ? 1 : s))
}
{ nvidia-smi; df -h .; nproc; free -g; python3 -V; env | grep -i "arch_list\|^cuda"; } > "$G/machine.txt" 2>&1
export GPU_SETUP_LOGS=$G/setup-logs
# shellcheck source=gpu_setup.sh
if ! source scripts/gpu_setup.sh > "$G/setup.txt" 2>&1; then cat "$G/setup.txt"; pack; exit 1; fi
echo "setup: $SECONDS s"
# the host-side copies of an optimizer step, timed apart (the cast and the gradients' device-to-host copies)
timeout -k 5 90 python3 scripts/host_copy_probe.py --json "$G/host_copy_probe.json" > "$G/host_copy_probe.txt" 2>&1
grep -v WARN "$G/host_copy_probe.txt" | tail -14
timeout -k 10 "$(left 200)" bash scripts/gpu_check.sh --no-bench --out "$G" > "$G/check.txt" 2>&1
check_rc=$?
tail -16 "$G/check.txt"
echo "gpu_check: exit $check_rc at $SECONDS s"
timeout -k 10 "$(left 90)" python3 -m tencache_ds.cli.main bench --model "$MODEL" \
  --config configs/stock-nvme-defaults.json --compare cpu --steps 8 --warmup 2 --nvme-path "$G/nvme/bench" \
  --out "$G/bench-defaults" > "$G/bench.log" 2>&1
echo "bench: exit $? at $SECONDS s"
sed -n '/^| step time/,/^| identical/p' "$G/bench-defaults/bench.md" 2>/dev/null
# host time per phase of a step, both arms (scripts/step_phases.py): py-spy --native slowed a step tenfold and failed
# on stock's frames (the second H200 lease), and cProfile misattributes waits on Python 3.12
ARGS=(--deepspeed_config configs/stock-nvme-defaults.json --model "$MODEL" --steps 8 --micro-batch 2 --seq-len 64
      --dtype bf16 --weights-gather grouped)
if [ "$(left)" -gt 100 ]; then
  per_arm=$(($(left 10) / 2))
  export STEP_PHASES_SYNC=1  # as docs/gpu_check.md's table was measured (a GPU wait after each step, both arms)
  timeout -k 10 "$per_arm" python3 scripts/step_phases.py tencache "$G/phases-tencache.json" -- scripts/train.py \
    "${ARGS[@]}" --nvme-path "$G/nvme/t" --tencache-block '{"enabled": true}' \
    --result-file "$G/phases-tencache.result.json" \
    > "$G/phases-tencache.log" 2>&1
  timeout -k 10 "$per_arm" python3 scripts/step_phases.py stockcpu "$G/phases-stockcpu.json" -- scripts/train.py \
    "${ARGS[@]}" --nvme-path "$G/nvme/s" --tencache-block none --offload-device cpu --stage3-defaults \
    --result-file "$G/phases-stockcpu.result.json" > "$G/phases-stockcpu.log" 2>&1
  grep -h "^\[phases\] [a-z]" "$G"/phases-*.log
  echo "step phases: done at $SECONDS s"
fi
pack
exit $check_rc
