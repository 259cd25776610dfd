#!/usr/bin/env bash
# Everything a 15-minute GPU lease is for, in one device call (docs/gpu_check.md): set up, then the parts asked for,
# each bounded so that the results are packed before the call's limit: by default gpu_check.sh without its bench
# (parity and the device tier), the host time per phase of both same-knobs arms' steps under the launcher
# (scripts/step_phases.py), and the arms' step times side by side (ab).
#   here:  bash scripts/gpu_setup.sh --prepare            # wheels and libaio into .gpu/
#   there: bash scripts/gpu_lease.sh                      # device run, carry [".gpu"], timeout_s 600
# Writes $OUT/gc.tgz (every log, result, metrics file and profile), plus gpu_check.md and bench.md beside it.
# Options: --budget-s N (seconds the whole script may take, default 570), --model NAME (the bench's, gpt2-small),
# --parts LIST (comma-separated, run in this order: probe, check, estimate, validate, bench, phases/plainphases, ab,
# trace;
# default check,phases,ab:
# the probe and the bench were measured in the earlier leases, docs/gpu_check.md).
# estimate: `tencache-ds estimate --machine this` on the GPU (the calibration's GPU branch, never run on one before
# the ninth lease), for gpt2-tiny as gpu_check trains it (bf16, micro-batch 2 x 64, GAS 1), so that its predicted
# step times sit beside check's measured stock-gas1 and auto-gas1 runs; writes estimate.json and machine-this.json.
# validate: scripts/validate_estimate.py, prospective, on the GPU (VALIDATE_MODELS, default gpt2-small;
# VALIDATE_BUDGETS, default "auto stream"; bf16, --profile-runs, VALIDATE_STEPS steps, default 5, after 2): the
# step model's predictions for stock NVMe and tencache written before their benches run; writes validate/.
# ab: the same-knobs bench's arms without a profiler, alternating, 16 steps each, through the launcher: tencache,
# stock CPU offload, tencache with its device tier off (device_cache_bytes 0), then tencache and stock again (or the
# runs named in AB_RUNS, e.g. "stockcpu-1 tencache-1 stockcpu-2 tencache-2"); tencache's arms keep their per-step
# metrics beside their results (ab/RUN.metrics.jsonl; steps may time a little slower than the earlier leases').
# A baseline for A/B on the device: git archive a commit's tencache_ds into .gpu/base (here:
#   rm -rf .gpu/base && mkdir -p .gpu/base && git archive HEAD tencache_ds | tar x -C .gpu/base &&
#   git rev-parse HEAD > .gpu/base/COMMIT), then name basetencache-N runs in AB_RUNS.
# phases: the arms named in PHASE_ARMS (default "tencache stockcpu"); STEP_PHASES_DETAIL=1 in the environment
# times every method of tencache's coordinator, swappers and entry store as well (scripts/step_phases.py).
# trace: both arms of the same-knobs bench, alternating, twice each, through the launcher, with a torch.profiler
# trace of steps 6 and 7 of each run (scripts/torch_trace.py; host and CUDA timelines, runtime calls that can wait);
# its median leaves out steps 5 (which pays for starting the profiler), 6 and 7.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=570
MODEL=gpt2-small
PARTS=check,phases,ab
while [ $# -gt 0 ]; do
  case "$1" in
    --budget-s) BUDGET=$2; shift ;;
    --model) MODEL=$2; shift ;;
    --parts) PARTS=$2; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
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
  # the traces beside gc.tgz, one file each (a device call returns at most 8 files from $OUT), and not inside it
  if [ -d "$G/trace" ]; then cp "$G"/trace/*.trace.json.gz "$OUT/" 2>/dev/null; rm -f "$G"/trace/*.trace.json.gz; fi
  tar czf "$OUT/gc.tgz" gc
}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
left() {  # seconds left of the budget, less $1, at least 1 (timeout 0 would mean no limit)
  local s=$((BUDGET - SECONDS - ${1:-0}))
  echo $((s < 1 ? 1 : s))
}
# the cores' NUMA nodes and the GPU's, and whether the kernel moves threads between nodes: a run slower than its
# twin as a whole (the sixth lease's) could be one whose memory or threads landed on the GPU's far node
{ nvidia-smi; df -h .; nproc; free -g; python3 -V; env | grep -i "arch_list\|^cuda"; lscpu; nvidia-smi topo -m
  grep . /sys/devices/system/node/node*/cpulist /proc/sys/kernel/numa_balancing; } > "$G/machine.txt" 2>&1
export GPU_SETUP_LOGS=$G/setup-logs
# shellcheck source=gpu_setup.sh
if ! source scripts/gpu_setup.sh > "$G/setup.txt" 2>&1; then cat "$G/setup.txt"; pack; exit 1; fi
echo "setup: $SECONDS s"
if [ -d .gpu/base/tencache_ds ]; then  # the baseline package for basetencache* arms gets the arena just built
  cp tencache_ds/_tencache_arena*.so .gpu/base/tencache_ds/ && echo "base: $(cat .gpu/base/COMMIT 2>/dev/null)"
  # what a basetencache arm's scripts/train.py imports (the base, unless the repository comes first on its path)
  echo "base arm imports: $(cd scripts && PYTHONPATH="$PWD/../.gpu/base:$PYTHONPATH" python3 -c \
    'import tencache_ds; print(tencache_ds.__file__)' 2>&1 | tail -1)"
fi
check_rc=0
if has probe; then  # the host-side copies of an optimizer step, timed apart (the cast, the gradients' D2H copies)
  timeout -k 5 90 python3 scripts/host_copy_probe.py --json "$G/host_copy_probe.json" > "$G/host_copy_probe.txt" 2>&1
  grep -v WARN "$G/host_copy_probe.txt" | tail -14
fi
if has check; then
  reserve=200; has trace && reserve=170
  timeout -k 10 "$(left $reserve)" bash scripts/gpu_check.sh --no-bench --out "$G" > "$G/check.txt" 2>&1
  check_rc=$?
  tail -16 "$G/check.txt"
  echo "gpu_check: exit $check_rc at $SECONDS s"
fi
if has estimate; then
  # at most 200 s (the calibration's probes at gpt2-tiny's size: about 2 minutes here), and never the time the
  # parts after it are left
  reserve=60; has ab && reserve=200; has phases && reserve=$((reserve + 60))
  limit=$(left $reserve); [ "$limit" -gt 200 ] && limit=200
  timeout -k 10 "$limit" python3 -m tencache_ds.cli.main estimate --model configs/models/gpt2-tiny.json \
    --ds-config configs/stock-nvme.json --machine this --nvme-path "$G/nvme/estimate" --micro-batch 2 --seq 64 \
    --gas 1 --save-machine "$G/machine-this.json" --json > "$G/estimate.json" 2> "$G/estimate.log"
  echo "estimate: exit $? at $SECONDS s"
  python3 -c "import json, sys; e = json.load(open(sys.argv[1])); print('predicted step', e['step_time_s'], \
'bottleneck', e['bottleneck'])" "$G/estimate.json" 2>/dev/null || tail -5 "$G/estimate.log"
fi
if has validate; then
  # issue 14 on a GPU, prospective: scripts/validate_estimate.py calibrates this machine, profiles the model's
  # tencache run, writes every prediction (validate/predictions.json), and only then benches stock NVMe and
  # tencache for each budget; the parts after it keep what they reserve
  reserve=10; has ab && reserve=200; has phases && reserve=$((reserve + 60))
  # shellcheck disable=SC2086
  timeout -k 10 "$(left $reserve)" python3 scripts/validate_estimate.py --models ${VALIDATE_MODELS:-gpt2-small} \
    --budgets ${VALIDATE_BUDGETS:-auto stream} --dtype bf16 --steps "${VALIDATE_STEPS:-5}" --warmup 2 --repeats 1 \
    --profile-runs --nvme-path "$G/nvme/validate" --out "$G/validate" > "$G/validate.log" 2>&1
  echo "validate: exit $? at $SECONDS s"
  # the process baseline and what it held (a GPU's: the process's size after its context, a matmul, NCCL's group)
  python3 -c "import json, sys; m = json.load(open(sys.argv[1])); print('baseline', m['process_baseline_bytes'], \
m['sources']['process_baseline_bytes'])" "$G/validate/machine.json" 2>/dev/null
  grep -v WARN "$G/validate.log" | tail -20
  # the same rows priced from the calibration alone (no profile): what `tencache-ds estimate --machine this` says
  timeout -k 5 60 python3 scripts/validate_estimate.py --reprice "$G/validate" --reprice-from calibration \
    --out "$G/validate-calibration" 2>&1 | grep -v WARN | tail -12
fi
has bench && timeout -k 10 "$(left 90)" python3 -m tencache_ds.cli.main bench --model "$MODEL" \
  --config configs/stock-nvme-defaults.json --compare cpu --steps 8 --warmup 2 --nvme-path "$G/nvme/bench" \
  --out "$G/bench-defaults" > "$G/bench.log" 2>&1
has bench && echo "bench: exit $? at $SECONDS s" && sed -n '/^| step time/,/^| identical/p' \
  "$G/bench-defaults/bench.md" 2>/dev/null
# host time per phase of a step, both arms (scripts/step_phases.py): py-spy --native slowed a step tenfold and failed
# on stock's frames (the second H200 lease), and cProfile misattributes waits on Python 3.12
ARGS=(--deepspeed_config configs/stock-nvme-defaults.json --model "$MODEL" --steps 8 --micro-batch 2 --seq-len 64
      --dtype bf16 --weights-gather grouped)
arm_args() {  # sets EXTRA, scripts/train.py's arguments, and ARM_ENV, its environment, for an arm named tencache*,
             # nodevice*, stockcpu* or basetencache* (tencache as of the commit in .gpu/base, see BASE below)
  ARM_ENV=(PYTHONPATH="$PYTHONPATH")
  case $1 in
    tencache*) EXTRA=(--tencache-block '{"enabled": true}') ;;
    basetencache*) EXTRA=(--tencache-block '{"enabled": true}'); ARM_ENV=(PYTHONPATH="$PWD/.gpu/base:$PYTHONPATH") ;;
    nodevice*) EXTRA=(--tencache-block '{"enabled": true, "device_cache_bytes": 0}') ;;
    stockcpu*) EXTRA=(--tencache-block none --offload-device cpu --stage3-defaults) ;;
    *) echo "gpu_lease.sh: unknown arm $1 (tencache*, basetencache*, nodevice*, stockcpu*)" >&2; return 1 ;;
  esac
}
step_medians() {  # FILE [SKIP]: the result file's step times, and their median after 2 warm-up steps, leaving out
                  # the steps listed in SKIP (comma-separated, counted from 0); then each step's CPU time (training
                  # thread, process) where the result has it
  python3 -c "import json,sys,statistics as s; t=[x['time_s'] for x in json.load(open(sys.argv[1]))['steps']]; \
skip={int(i) for i in sys.argv[2].split(',') if i}; \
print('steps', ' '.join(f'{v:.3f}' for v in t), 'median', round(s.median(v for i, v in enumerate(t) \
if i >= 2 and i not in skip), 4)); c=[x.get('cpu') for x in json.load(open(sys.argv[1]))['steps']]; \
all(c) and print('thread cpu', ' '.join(f\"{x['thread_cpu_s']:.3f}\" for x in c), \
'process cpu', ' '.join(f\"{x['process_cpu_s']:.2f}\" for x in c))" "$1" "${2:-}" 2>/dev/null
}
run_phases() {  # ARM LAUNCH SECONDS: step_phases.py over one arm, through the launcher (launcher) or not (plain)
  local arm=$1 launch=$2 limit=$3 tag=$1-$2
  arm_args "$arm" || return 1
  local cmd=(python3 -m deepspeed.launcher.runner --num_gpus 1)
  [ "$launch" = plain ] && cmd=(python3)
  timeout -k 10 "$limit" env "${ARM_ENV[@]}" "${cmd[@]}" scripts/step_phases.py "$tag" "$G/phases-$tag.json" -- \
    scripts/train.py \
    "${ARGS[@]}" --nvme-path "$G/nvme/p-$tag" "${EXTRA[@]}" --result-file "$G/phases-$tag.result.json" \
    > "$G/phases-$tag.log" 2>&1
  echo "phases $tag: exit $? at $SECONDS s"
  step_medians "$G/phases-$tag.result.json"
}
if has phases || has plainphases; then
  # through the launcher and without a GPU wait after each step, as the bench runs its arms: the H200's synchronised
  # phases without the launcher (docs/gpu_check.md) made stock's step 0.275 s where the bench measured 0.19-0.20 s;
  # plainphases runs both arms without the launcher, alternating with the launcher's runs, to tell the two apart
  runs=()
  for arm in ${PHASE_ARMS:-tencache stockcpu}; do
    has phases && runs+=("$arm launcher")
    has plainphases && runs+=("$arm plain")
  done
  for i in "${!runs[@]}"; do
    run=${runs[$i]}
    per_run=$(($(left 10) / (${#runs[@]} - i))); has ab && [ "$per_run" -gt 60 ] && per_run=60  # the rest is ab's
    [ "$per_run" -gt 30 ] || break
    # shellcheck disable=SC2086
    run_phases $run "$per_run"
  done
  grep -h "^\[phases\] [a-z]" "$G"/phases-*.log
  echo "step phases: done at $SECONDS s"
fi
if has ab; then
  mkdir -p "$G/ab"
  for run in ${AB_RUNS:-tencache-1 stockcpu-1 nodevice-1 tencache-2 stockcpu-2}; do
    [ "$(left 10)" -gt 45 ] || break
    arm_args "$run" || continue
    # tencache's arms (base and nodevice too) keep their per-step metrics (fetch waits, bytes, gathers): a run
    # slower than its twin (the sixth lease's) shows which of them grew
    metrics=", \"metrics_path\": \"$G/ab/$run.metrics.jsonl\"}"
    [[ "${EXTRA[1]:-}" == '{"enabled": true'* ]] && EXTRA[1]="${EXTRA[1]%\}}$metrics"
    timeout -k 10 "$(left 10)" env "${ARM_ENV[@]}" python3 -m deepspeed.launcher.runner --num_gpus 1 scripts/train.py \
      "${ARGS[@]}" --steps 16 --nvme-path "$G/nvme/$run" "${EXTRA[@]}" --result-file "$G/ab/$run.result.json" \
      > "$G/ab/$run.log" 2>&1
    echo "ab $run: exit $? at $SECONDS s"
    step_medians "$G/ab/$run.result.json"
  done
fi
if has trace; then
  mkdir -p "$G/trace"
  for round in 1 2; do
    for arm in tencache stockcpu; do
      [ "$(left 15)" -gt 40 ] || break 2
      arm_args "$arm" || continue
      TORCH_TRACE_OUT=$G/trace TORCH_TRACE_LABEL=$arm-$round timeout -k 10 "$(left 15)" env "${ARM_ENV[@]}" \
        python3 -m deepspeed.launcher.runner --num_gpus 1 scripts/torch_trace.py scripts/train.py \
        "${ARGS[@]}" --steps 10 --nvme-path "$G/nvme/$arm-$round" "${EXTRA[@]}" \
        --result-file "$G/trace/$arm-$round.result.json" > "$G/trace/$arm-$round.log" 2>&1
      echo "trace $arm-$round: exit $? at $SECONDS s"
      grep -h "^\[torch_trace\]" "$G/trace/$arm-$round.log"
      step_medians "$G/trace/$arm-$round.result.json" 5,6,7  # 5 starts the profiler, 6 and 7 are profiled
    done
  done
fi
pack
exit $check_rc
