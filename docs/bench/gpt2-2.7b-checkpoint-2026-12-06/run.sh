#!/bin/bash
# A checkpoint save of gpt2-2.7b (fp32, twice this machine's memory; its partitions stream, so the save writes the
# fp32 masters owed to their files from the partitions' files first): one save after 3 steps (every master owed from
# the first step here), no step after it (the swap files, 41.6 GB, and one checkpoint fit this disk; the files a step
# would write again beside the checkpoint's do not). Then stock's, whose copy of its 31.2 GB optimizer swap folder
# does not fit beside its swap files.
# Run from the repository's root: bash docs/bench/gpt2-2.7b-checkpoint-2026-12-06/run.sh [tencache|stock]
set -e
O=$(cd "$(dirname "$0")" && pwd) NVME=${NVME_DIR:-/tmp/ck-nvme} CKPT=${CKPT_DIR:-/tmp/ck-dir}
C=$O/stock-nvme-beyond-ram-2.7b-micro-batch-1.json
trap 'rm -rf "$NVME" "$CKPT"' EXIT
for mode in ${*:-tencache stock}; do
    rm -rf "$NVME" "$CKPT"; mkdir -p "$NVME" "$CKPT"
    df -B1 --output=avail "$NVME" > "$O/$mode-free-before.txt"
    CHECKPOINT_SAVE_WARMUP=3 CHECKPOINT_SAVES=1 CHECKPOINT_STEP_AFTER_LAST=0 /usr/bin/time -v \
        python tests/deepspeed/measure_checkpoint_save.py "$mode" gpt2-2.7b "$NVME" "$CKPT" auto - "$C" \
        > "$O/$mode.log" 2>&1 || echo "$mode: exit $?" >> "$O/$mode.log"
done
# Then, for the ZeRO file's reads of the masters the save has just written (io/save_from_files.UncachedFile), the
# tencache arm alone, the same command with its log named: tencache-uncached-reads.log (the change, uncommitted in
# the main checkout), then tencache-again-b3d3cbc.log (the code before, run from a worktree at b3d3cbc with
# PYTHONPATH set to it), then tencache-uncached-reads-6032de4.log (the change as committed):
#   CHECKPOINT_SAVE_WARMUP=3 CHECKPOINT_SAVES=1 CHECKPOINT_STEP_AFTER_LAST=0 /usr/bin/time -v python \
#       tests/deepspeed/measure_checkpoint_save.py tencache gpt2-2.7b /tmp/ck-nvme /tmp/ck-dir auto - "$C"
