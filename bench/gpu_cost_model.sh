#!/usr/bin/env bash
# On the GPU machine (after bench/pack.sh here; from the repository root with .gpu carried):
# the cost model's predicted epoch against the measured one on issue 28's H200 runs. Measures
# the rates once (`grinnder bench rates`, the storage directory included), then per run prints
# `info`'s plan and prediction (made before any epoch) and `train`'s epochs with its own line
# of predicted against measured after epoch 1; with THREE_TIERS=1 also igb-medium-like at
# scale 0.7 under --gpu-mem 24GiB --host-mem 10GiB --storage-dir (29 GB of graph, 16 GB of
# block files: mind the disk), with dd's O_DIRECT rates on the same directory.
#
#   bench/gpu_cost_model.sh
#   THREE_TIERS=1 bench/gpu_cost_model.sh
# Full logs under $OUT (or /tmp/gpu-out).
set -uo pipefail
bin=.gpu/bin/grinnder
out=${OUT:-/tmp/gpu-out}
work=/tmp/gpu-data/cost-model
store=$work/storage
mkdir -p "$out" "$store"
export XDG_CACHE_HOME=$work/cache
cat .gpu/COMMIT 2>/dev/null
$bin bench --device cuda rates --storage-dir "$store" > "$out/rates.json" 2> "$out/rates.err"
common=(--device cuda --model gcn --layers 2 --hidden 256 --dropout 0 --input-dropout 0 --weight-decay 0
  --feature-norm none)
run() { # name graph epochs flags...
  local name=$1 g=$2 epochs=$3
  shift 3
  echo "== $name: $*"
  $bin info "$g" "${common[@]}" "$@" > "$out/$name.info" 2> "$out/$name.info.err"
  grep -E "^(GPU tier|per epoch|predicted)" "$out/$name.info"
  $bin -v train "$g" "${common[@]}" "$@" --epochs "$epochs" --eval-every 0 \
    --metrics-out "$out/$name.jsonl" > "$out/$name.log" 2>&1
  grep -E "INFO epoch [0-9]:|predicted|rror" "$out/$name.log" | cut -c1-300
}
p=$work/products-like.grnd
[ -f "$p" ] || $bin -q generate --preset products-like --seed 0 --out "$p"
run p4-6g "$p" 3 --parts 4 --gpu-mem 6GiB
run p2-10g "$p" 3 --parts 2 --gpu-mem 10GiB
run p16-8g "$p" 3 --parts 16 --gpu-mem 8GiB
if [ "${THREE_TIERS:-0}" = 1 ]; then
  rm -f "$p"
  g=$work/igb-medium-like-0.7.grnd
  [ -f "$g" ] || $bin -q generate --preset igb-medium-like --scale 0.7 --seed 0 --out "$g"
  dd if=/dev/zero of="$store/dd" bs=64M count=128 oflag=direct 2>&1 | tail -1
  dd if="$store/dd" of=/dev/null bs=64M iflag=direct 2>&1 | tail -1
  rm -f "$store/dd"
  run tiers3 "$g" 2 --parts 64 --gpu-mem 24GiB --host-mem 10GiB --storage-dir "$store"
fi
