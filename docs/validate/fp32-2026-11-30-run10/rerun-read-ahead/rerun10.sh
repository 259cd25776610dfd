#!/bin/bash
# The quarter and stream configurations of run 10 again, with the reads ahead fixed; the same bench commands.
cd "$(dirname "$0")/../../../.."; OUT=${OUT:-/tmp/run10b}; mkdir -p $OUT
for name in gpt2-tiny-quarter gpt2-tiny-stream gpt2-small-quarter gpt2-small-stream gpt2-medium-quarter gpt2-medium-stream; do
  model=${name%-*}; budget=${name##*-}
  case $name in
    gpt2-tiny-quarter) host=68MB;; gpt2-small-quarter) host=560MB;; gpt2-medium-quarter) host=1600MB;; *) host=0;;
  esac
  config=configs/stock-nvme.json; [ $model = gpt2-medium ] && config=configs/stock-nvme-large-vocab.json
  echo "running $name $(date -u +%H:%M:%S)"
  python -m tencache_ds.cli.main bench --model $model --config $config --steps 6 --warmup 2 --repeats 1 --micro-batch 2 \
    --seq-len 64 --host-cache-bytes $host --out $OUT/$name --nvme-path /tmp/validate-nvme --no-plots --dtype fp32 > $OUT/$name.log 2>&1
done
echo done $(date -u +%H:%M:%S)
