#!/bin/bash
# gpt2-2.7b's checkpoint save (fp32, twice this machine's memory, partitions streaming: the save settles the fp32
# masters owed to their files from the partitions' files), tencache alone, the ZeRO file written from the copies the
# settle fills ("settled-once": io/save_from_files.FilledWhenWritten) against the code before it ("before": the ZeRO
# file read the masters back from the files just written, through O_DIRECT). Each run is a tree's own
# tests/deepspeed/measure_checkpoint_save.py, run from that tree (its script puts its tree first on sys.path): this
# checkout, and BEFORE, a worktree at the commit before the change with its native arena built.
# Run from the repository's root: BEFORE=/path/to/worktree bash docs/bench/gpt2-2.7b-checkpoint-settled-once-2026-12-06/run.sh
# The order run: settled-once-1, settled-once-1b (meant as "before", but it ran this checkout's code: PYTHONPATH does
# not outrank the script's own tree), settled-once-2, then what follows: before-1, settled-once-3, before-2.
set -e
O=$(cd "$(dirname "$0")" && pwd) NVME=${NVME_DIR:-/tmp/ck-nvme} CKPT=${CKPT_DIR:-/tmp/ck-dir}
C=$O/stock-nvme-beyond-ram-2.7b-micro-batch-1.json HERE=$PWD
trap 'rm -rf "$NVME" "$CKPT"' EXIT
run() {  # $1: log name, $2: the tree that runs
    rm -rf "$NVME" "$CKPT"; mkdir -p "$NVME" "$CKPT"
    (cd "$2" && CHECKPOINT_SAVE_WARMUP=3 CHECKPOINT_SAVES=1 CHECKPOINT_STEP_AFTER_LAST=0 /usr/bin/time -v \
        python tests/deepspeed/measure_checkpoint_save.py tencache gpt2-2.7b "$NVME" "$CKPT" auto - "$C") \
        > "$O/$1.log" 2>&1 || echo "$1: exit $?" >> "$O/$1.log"
}
BEFORE=${BEFORE:?a worktree at the commit before the change}
run before-1 "$BEFORE"
run settled-once-3 "$HERE"
run before-2 "$BEFORE"
