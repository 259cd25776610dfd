#!/bin/bash
# gpt2-2.7b beyond RAM, tencache "auto" alone, traced: the loop of ../gpt2-2.7b-traced-2026-12-06/ab.sh (wrap.py is
# ../phases-traced-2026-12-06/wrap.py, copied to /tmp/trace27 first), trees in turn: the code before (ea07773, old-1,
# old-2), the change with each owed master filled at its swap-in (new-1, new-2), and read ahead from the partitions
# too (ra-1: f9aa4a7 before the review's fixes):
#   PAIRS="new-1:/tmp/wt-new old-1:/tmp/wt-old new-2:/tmp/wt-new" STEPS=5 bash ab.sh
#   PAIRS="ra-1:/tmp/wt-ra old-2:/tmp/wt-old" STEPS=5 bash ab.sh
exec bash "$(dirname "$0")/../gpt2-2.7b-traced-2026-12-06/ab.sh"
