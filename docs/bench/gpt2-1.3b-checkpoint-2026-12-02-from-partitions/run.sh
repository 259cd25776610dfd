#!/bin/bash
# The beyond-RAM model's checkpoint saves on ext4 (docs/benchmarks.md, "Masters from the parameter partitions"), one
# run each, in this order: the code before (c248f5f, in a worktree) with the masters owed at the save (3 steps first),
# this code with none owed (2 steps first), the code before with none owed, this code with them owed; stock with its
# own config (micro-batch 2, which a copy of the swap folder does not depend on). Run from the repository's root.
set -e
O=$(cd "$(dirname "$0")" && pwd) REPO=$(pwd) NVME=${NVME_DIR:-/tmp/ck-nvme} CKPT=${CKPT_DIR:-/tmp/ck-dir}
C=$O/stock-nvme-beyond-ram-micro-batch-1.json
[ -d /tmp/wt-before ] || { git worktree add -f /tmp/wt-before c248f5f -q; cp tencache_ds/_tencache_arena*.so /tmp/wt-before/tencache_ds/; }
one() {  # name, code folder, mode, warm-up steps, config
    rm -rf "$NVME" "$CKPT"; mkdir -p "$NVME" "$CKPT"
    (cd "$2" && PYTHONPATH="$2" CHECKPOINT_SAVE_WARMUP=$4 python tests/deepspeed/measure_checkpoint_save.py "$3" gpt2-1.3b \
        "$NVME" "$CKPT" auto - "$5" > "$O/$1.log" 2>&1)
}
trap 'rm -rf "$NVME" "$CKPT"; git worktree remove --force /tmp/wt-before; git worktree prune' EXIT
one before-owed /tmp/wt-before tencache 3 "$C"
one tencache-none-owed "$REPO" tencache 2 "$C"
one before-none-owed /tmp/wt-before tencache 2 "$C"
one tencache-owed "$REPO" tencache 3 "$C"
one stock "$REPO" stock 2 configs/stock-nvme-beyond-ram.json
# tencache-none-owed.log above was measured at 43bb269 (the gather by torch's copy); run again at ca8c2ee (memmove),
# then stock again (its saves took twice as long as in the session before):
one tencache-none-owed-ca8c2ee "$REPO" tencache 2 "$C"
one stock-again "$REPO" stock 2 configs/stock-nvme-beyond-ram.json
