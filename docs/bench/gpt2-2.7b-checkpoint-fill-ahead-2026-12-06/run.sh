#!/bin/bash
# gpt2-2.7b's checkpoint save (fp32, twice this machine's memory, partitions streaming: every fp32 master owed to its
# file is settled from the partitions' files as the ZeRO file's writer reaches it), tencache alone: this checkout
# ("after": the next master's fill started while the last one's writes run, in two copies used again) against the
# code before it ("before": a worktree at 66b7a16 with its native arena built). Each run is a tree's own
# tests/deepspeed/measure_checkpoint_save.py, run from that tree. Run from the repository root:
#   BEFORE=/path/to/worktree bash docs/bench/gpt2-2.7b-checkpoint-fill-ahead-2026-12-06/run.sh
# The order run: after27-1, before27-1, before27-2, after27-2 (logs after-1 ... here as after27-*.log, before27-*.log), and
# at d9d7bb5 (the copy written to the ZeRO file straight from its memory) direct-1.log (then, on gpt2-1.3b with host_cache_bytes 1e9 so that
# its partitions stream too: base13-1 (the code before), after13-1, before13-2, after13-2; MODEL=gpt2-1.3b BUDGET=1000000000
# CONFIG=configs/stock-nvme-beyond-ram.json).
set -e
O=$(cd "$(dirname "$0")" && pwd) NVME=${NVME_DIR:-/tmp/ck-nvme} CKPT=${CKPT_DIR:-/tmp/ck-dir} HERE=$PWD
MODEL=${MODEL:-gpt2-2.7b} BUDGET=${BUDGET:-auto}
C=${CONFIG:-$HERE/docs/bench/gpt2-2.7b-checkpoint-settled-once-2026-12-06/stock-nvme-beyond-ram-2.7b-micro-batch-1.json}
case $C in /*) ;; *) C=$HERE/$C;; esac
trap 'rm -rf "$NVME" "$CKPT"' EXIT
run() {  # $1: log name, $2: the tree that runs
    rm -rf "$NVME" "$CKPT"; mkdir -p "$NVME" "$CKPT"
    (cd "$2" && CHECKPOINT_SAVE_WARMUP=3 CHECKPOINT_SAVES=1 CHECKPOINT_STEP_AFTER_LAST=0 /usr/bin/time -v \
        python tests/deepspeed/measure_checkpoint_save.py tencache "$MODEL" "$NVME" "$CKPT" "$BUDGET" - "$C") \
        > "$O/$1.log" 2>&1 || echo "$1: exit $?" >> "$O/$1.log"
}
BEFORE=${BEFORE:?a worktree at the commit before the change}
run after-1 "$HERE"
run before-1 "$BEFORE"
run before-2 "$BEFORE"
run after-2 "$HERE"
