#!/bin/bash
# A/B: tencache gpt2-small fp32 at 560MB (one sub-group), the bench's arguments; $1 = tree, $2 = label, $3 = budget
tree=$1; label=$2; budget=${3:-560MB}; out=/tmp/ab/$label; mkdir -p /tmp/ab; rm -rf /tmp/ab-nvme-$label
cd $tree && python -m deepspeed.launcher.runner --num_gpus 1 --master_port $((42000 + RANDOM % 1000)) scripts/train.py \
  --deepspeed_config ${CONFIG:-configs/stock-nvme.json} --model ${MODEL:-gpt2-small} --steps ${STEPS:-8} --micro-batch 2 --seq-len 64 --dtype fp32 \
  --nvme-path /tmp/ab-nvme-$label --weights-gather none \
  --tencache-block "{\"enabled\": true, \"host_cache_bytes\": \"$budget\", \"device_cache_bytes\": \"auto\", \"metrics_path\": \"$out.metrics.jsonl\"}" \
  --result-file $out.result.json > $out.log 2>&1
rm -rf /tmp/ab-nvme-$label
grep "^step" $out.log | tr '\n' ' '; echo
python3 - $out <<'PY'
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]+".metrics.jsonl")]
print(' '.join(f"{r['step']}:{r['step_time_s']:.2f}/w{(r.get('optimizer_nvme_wait_s') or 0):.2f}" for r in rows))
s=json.load(open(sys.argv[1]+".result.json"))['steps'][-1]['stats']
print({k:s.get(k) for k in ['optimizer_cache_prefetch_issued','optimizer_backward_reads_ahead','optimizer_nvme_wait_s']})
PY
