#!/usr/bin/env bash
# The first thing to run on a lent CUDA machine (docs/gpu_check.md): what the CPU machines cannot show.
#   bash scripts/gpu_check.sh            # check the environment, run everything, write the report; exit 1 on a
#                                        # difference or a failed run
#   bash scripts/gpu_check.sh --dry-run  # check the environment and print what would run (passes on a CPU machine)
# Options: --no-bench (steps 1 and 2 only), --out DIR (default: $OUT when set, else gpu-check-out),
#          --model NAME (default gpt2-tiny), --quarter-bytes N (the "25%" host budget, default 70000000: a quarter
#          of gpt2-tiny's offloaded bytes).
#
# What it runs (one rank, bf16, parameters and optimizer on NVMe, 3 steps each, about 5 minutes on an H100):
#   1. parity: stock DeepSpeed vs tencache (streaming, a 25% host budget, "auto"), gradient accumulation 1 and 4:
#      the loss bits of every step and the fp32 weights' sha256 must be equal;
#   2. the device tier on real GPU memory: the "auto" runs' per-step metrics: the tier applies (a gather is an
#      H2D copy here, not the partition), the bytes gathered per step do not grow with gradient accumulation
#      (GAS 4 <= 1.05 x GAS 1), and the hit rate is reported;
#   3. a short bench (stock NVMe, tencache, stock CPU offload with DeepSpeed's defaults), its bench.md kept.
# Writes DIR/gpu_check.md (the verdicts, the device, the numbers) and every run's log and result under DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY_RUN=0
BENCH=1
OUT_DIR=${OUT:-gpu-check-out}
MODEL=gpt2-tiny
QUARTER=70000000
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --no-bench) BENCH=0 ;;
    --out) OUT_DIR=$2; shift ;;
    --model) MODEL=$2; shift ;;
    --quarter-bytes) QUARTER=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# ------------------------------------------------------------------------------------------------ environment
problems=0
check() {  # check NAME COMMAND...: prints ok/MISSING; counts what a real run would need
  if "${@:2}" >/dev/null 2>&1; then echo "  ok       $1"; else echo "  MISSING  $1"; problems=$((problems + 1)); fi
}
echo "== environment"
# The Python requirements in one process (each import once: a process per check cost half a minute of imports).
python_lines=$("$PY" - <<'PYEOF' 2>/dev/null
import sys


def check(name, test):
    try:
        ok = bool(test())
    except Exception:  # an import or an assertion that failed: that requirement is missing
        ok = False
    print(f"@@  {'ok      ' if ok else 'MISSING '} {name}", flush=True)


def cuda():
    import torch
    return torch.cuda.is_available()


def deepspeed_019():
    import deepspeed
    return deepspeed.__version__.startswith("0.19.")


def native_arena():
    import tencache_ds.memory as memory
    return memory.native_available()


check(f"python ({sys.executable})", lambda: sys.version_info >= (3, 10))
check("torch", lambda: __import__("torch"))
check("a CUDA device (torch.cuda.is_available())", cuda)
check("deepspeed 0.19.x", deepspeed_019)
check("tencache_ds with its native arena", native_arena)
check("scripts/train.py's imports (transformers)", lambda: __import__("transformers"))
try:
    import torch
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        print(f"@@  device   {props.name}, {props.total_memory / 2**30:.1f} GiB, torch {torch.__version__} "
              f"(CUDA {torch.version.cuda})")
except Exception:
    pass
print("@@done", flush=True)
PYEOF
)
python_done=$(grep -c '^@@done' <<< "$python_lines")
python_lines=$(grep '^@@ ' <<< "$python_lines" | cut -c3-)
if [ -z "$python_lines" ]; then
  python_lines="  MISSING  python ($PY)"
elif [ "$python_done" != 1 ]; then  # it died part-way (an import that aborts the interpreter): the rest unsaid
  python_lines+=$'\n'"  MISSING  the rest of the Python checks (the checking process died)"
fi
echo "$python_lines" | grep -v "^  device"
problems=$((problems + $(grep -c "MISSING" <<< "$python_lines")))
check "nvidia-smi" nvidia-smi -L
check "ninja (DeepSpeed's JIT op builds)" ninja --version
check "libaio headers (DeepSpeed's async_io op)" sh -c "test -e /usr/include/libaio.h || test -n \"\${CFLAGS:-}\""
grep "^  device" <<< "$python_lines" || true

STEPS=3
NVME="$OUT_DIR/nvme"
TRAIN=(scripts/train.py --deepspeed_config configs/stock-nvme.json --model "$MODEL" --dtype bf16 --seq-len 64
       --steps "$STEPS" --weights-gather grouped)
declare -A BLOCKS=([stream]='{"host_cache_bytes": 0, "device_cache_bytes": 0}'
                   [quarter]="{\"host_cache_bytes\": $QUARTER}"
                   [auto]='{}')
plan() {  # every training run, one line each: LABEL GAS BLOCK
  for gas in 1 4; do
    echo "stock-gas$gas $gas none"
    for budget in stream quarter auto; do echo "$budget-gas$gas $gas $budget"; done
  done
}

if [ "$DRY_RUN" = 1 ]; then
  echo
  echo "== would run (output under $OUT_DIR)"
  while read -r label gas budget; do
    block=none; [ "$budget" != none ] && block=${BLOCKS[$budget]}
    [ "$budget" = auto ] && block="{\"metrics_path\": \"$OUT_DIR/$label.metrics.jsonl\"}"
    echo "  $PY ${TRAIN[*]} --grad-accum $gas --nvme-path $NVME/$label --tencache-block '$block'" \
         "--result-file $OUT_DIR/$label.json"
  done < <(plan)
  echo "  compare: per GAS, each tencache run's loss bits and weights sha256 with stock's"
  echo "  device tier: auto-gas4 device_fetch_bytes <= 1.05 x auto-gas1's; device_hit_rate reported (not null)"
  [ "$BENCH" = 1 ] && echo "  $PY -m tencache_ds.cli.main bench --model $MODEL --steps 4 --warmup 1 --compare cpu" \
       "--nvme-path $NVME/bench --out $OUT_DIR/bench"
  echo "  report: $OUT_DIR/gpu_check.md"
  if [ "$problems" -gt 0 ]; then
    echo
    echo "dry run: $problems requirement(s) missing here; a real run would stop at the environment check"
  fi
  exit 0
fi

if [ "$problems" -gt 0 ]; then
  echo "gpu_check.sh: $problems requirement(s) missing (above); nothing was run" >&2
  exit 1
fi

# ------------------------------------------------------------------------------------------------ runs
mkdir -p "$OUT_DIR"
failed_runs=0
while read -r label gas budget; do
  block=none; [ "$budget" != none ] && block=${BLOCKS[$budget]}
  [ "$budget" = auto ] && block="{\"metrics_path\": \"$OUT_DIR/$label.metrics.jsonl\"}"
  echo "== $label"
  rm -rf "$NVME/$label"
  if ! "$PY" "${TRAIN[@]}" --grad-accum "$gas" --nvme-path "$NVME/$label" --tencache-block "$block" \
       --result-file "$OUT_DIR/$label.json" > "$OUT_DIR/$label.log" 2>&1; then
    echo "   FAILED: $OUT_DIR/$label.log"; tail -5 "$OUT_DIR/$label.log"; failed_runs=$((failed_runs + 1))
  fi
  rm -rf "$NVME/$label"
done < <(plan)

bench_rc=skipped
if [ "$BENCH" = 1 ]; then
  echo "== bench"
  "$PY" -m tencache_ds.cli.main bench --model "$MODEL" --steps 4 --warmup 1 --compare cpu \
    --nvme-path "$NVME/bench" --out "$OUT_DIR/bench" > "$OUT_DIR/bench.log" 2>&1
  bench_rc=$?
fi
rm -rf "$NVME"

# ------------------------------------------------------------------------------------------------ verdicts
"$PY" - "$OUT_DIR" "$failed_runs" "$bench_rc" <<'PYEOF'
import json
import os
import sys

out, failed_runs, bench_rc = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def load(label):
    path = os.path.join(out, f"{label}.json")
    return json.load(open(path)) if os.path.exists(path) else None


def metrics(label):
    path = os.path.join(out, f"{label}.metrics.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


lines, bad = [], failed_runs > 0
for gas in (1, 4):
    stock = load(f"stock-gas{gas}")
    for budget in ("stream", "quarter", "auto"):
        ours = load(f"{budget}-gas{gas}")
        if stock is None or ours is None:
            verdict = "no result (a run failed)"
            bad = True
        else:
            same_losses = [s["loss_bits"] for s in stock["steps"]] == [s["loss_bits"] for s in ours["steps"]]
            same_weights = stock["weights_sha256"] == ours["weights_sha256"]
            enabled = (ours["steps"][-1].get("stats") or {}).get("tencache_enabled") == 1
            verdict = "identical" if same_losses and same_weights and enabled else (
                f"DIFFERENT (losses {'=' if same_losses else '!='}, weights {'=' if same_weights else '!='}, "
                f"tencache {'on' if enabled else 'OFF'})")
            bad |= verdict != "identical"
        lines.append(f"| {budget} | {gas} | {verdict} |")
fetched = {}
for gas in (1, 4):
    rows = metrics(f"auto-gas{gas}")
    last = rows[-1] if rows else {}
    fetched[gas] = last.get("device_fetch_bytes")
    lines.append(f"| device tier, auto, GAS {gas} | last step | fetch {last.get('device_fetch_bytes')} B "
                 f"in {last.get('device_gathers')} gathers, "
                 f"{last.get('device_fetch_s')} s, hit rate {last.get('device_hit_rate')}, "
                 f"held at most {last.get('device_cache_peak_bytes')} B during the step, "
                 f"{last.get('device_cache_bytes_in_use')} B at its end |")
if None in fetched.values() or not fetched[4] or fetched[4] > 1.05 * fetched[1]:
    lines.append(f"| device tier | GAS 4 vs 1 | FAILED: bytes gathered per step {fetched[4]} vs {fetched[1]} |")
    bad = True
else:
    lines.append(f"| device tier | GAS 4 vs 1 | ok: {fetched[4] / fetched[1]:.3f}x the bytes gathered at GAS 1 |")
if bench_rc != "skipped":  # --no-bench
    lines.append(f"| bench | | {'ok: bench/bench.md' if bench_rc == '0' else f'FAILED (exit {bench_rc}): bench.log'} |")
    bad |= bench_rc != "0"
try:
    import torch
    device = torch.cuda.get_device_name(0)
except Exception as err:  # the report is still written
    device = f"unknown ({err})"
report = ["# gpu_check", "", f"Device: {device}", "", "| check | GAS | result |", "|---|---|---|"] + lines
report += ["", "Verdict: " + ("FAILED" if bad else "passed")]
with open(os.path.join(out, "gpu_check.md"), "w") as handle:
    handle.write("\n".join(report) + "\n")
print("\n".join(report))
sys.exit(1 if bad else 0)
PYEOF
