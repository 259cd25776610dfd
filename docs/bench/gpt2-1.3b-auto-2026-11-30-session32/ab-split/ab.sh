# tencache arm of scripts/bench_beyond_ram.sh, back to back: /tmp/wt-old is a worktree at a4080e1, /work/main was at b4da805 (outputs renamed a4080e1.* and b4da805.*)
set -x
for tree in /tmp/wt-old /work/main; do
  name=$(basename $tree)
  rm -rf /tmp/ab13-nvme; mkdir -p /tmp/ab13
  cd $tree && python3 -m deepspeed.launcher.runner --num_gpus 1 scripts/train.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --steps 5 --micro-batch 1 --seq-len 32 --dtype fp32 --nvme-path /tmp/ab13-nvme --tencache-block "{\"enabled\": true, \"host_cache_bytes\": \"auto\", \"device_cache_bytes\": \"auto\", \"metrics_path\": \"/tmp/ab13/$name.metrics.jsonl\"}" --result-file /tmp/ab13/$name.result.json --label $name --weights-gather none > /tmp/ab13/$name.log 2>&1
done
rm -rf /tmp/ab13-nvme
