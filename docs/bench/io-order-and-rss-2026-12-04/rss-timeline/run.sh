# As run on 2026-12-04 (/tmp/rss): tencache "auto" then stock NVMe, gpt2-1.3b beyond RAM, VmRSS sampled every 50 ms
# by wrap.py with the engine's forward/backward/step marked; phases.py FILE.rss (gunzip first) prints them by phase.
#   ARMS="tencache stock" bash run.sh
OUT=/tmp/rss
for arm in ${ARMS:-tencache}; do
  rm -rf /tmp/br-nvme; mkdir -p /tmp/br-nvme
  extra=""
  if [ $arm != stock ]; then extra="--tencache-block {\"enabled\":true,\"host_cache_bytes\":\"auto\",\"metrics_path\":\"$OUT/$arm.metrics.jsonl\"}"; fi
  (cd /work/main && RSS_OUT=$OUT/$arm.rss MASTER_ADDR=127.0.0.1 MASTER_PORT=29544 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 PYTHONPATH=/work/main python3 -u /tmp/rss/wrap.py --deepspeed_config configs/stock-nvme-beyond-ram.json --model gpt2-1.3b --dtype fp32 --seq-len 32 --micro-batch 1 --steps 5 --nvme-path /tmp/br-nvme --weights-gather none $extra --result-file $OUT/$arm.result.json --label $arm > $OUT/$arm.log 2>&1)
  echo "$arm rc=$? $(date +%T)"
done
