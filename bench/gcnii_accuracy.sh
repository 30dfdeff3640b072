#!/usr/bin/env bash
# GCNII's test accuracy at depth, grinnder and PyG side by side on Cora's public split, same
# settings and seeds: 32 GCN2Conv layers of 64 channels, α 0.1, θ 0.5 (PyG's
# examples/gcn2_cora.py), dropout 0.6 on the input, before each conv and before the last
# Linear, Adam lr 0.01 with weight decay 5e-4 on every parameter, 300 epochs, row-normalised
# features; the test accuracy at the epoch of best validation accuracy, seeds 0–2. Beside it,
# grinnder's GCN at the same depth (32 layers of 64: over-smoothing) and at 2 layers.
# Usage: bench/gcnii_accuracy.sh [GRINNDER_BINARY] [PYTHON with torch and torch_geometric] [CORA_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/grinnder}
py=${2:-python3}
cora=${3:-data/cora}
data=${TMPDIR:-/tmp}/grinnder-cora-npy
[ -f "$data/edge_index.npy" ] || "$bin" -q export "$cora" --format npy --out "$data"
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); date: $(date -u +%F); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
common=(--hidden 64 --dropout 0.6 --input-dropout 0.6 --lr 0.01 --weight-decay 5e-4 --epochs 300)
run() { # tag seed flags...
  local tag=$1 seed=$2
  shift 2
  "$bin" -q train "$data" "${common[@]}" "$@" --seed "$seed" --metrics-out "/tmp/gcnii-$tag-$seed.jsonl" > /dev/null
  tail -1 "/tmp/gcnii-$tag-$seed.jsonl" | python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'grinnder': '$tag', 'seed': $seed, 'test_acc': d['test_acc'], 'best_epoch': d['best_epoch'], 'epoch_s_median': d.get('epoch_s_median')}))"
}
for seed in 0 1 2; do
  run gcnii-32 "$seed" --model gcnii --layers 32 --alpha 0.1 --theta 0.5
  run gcn-32 "$seed" --model gcn --layers 32
  run gcn-2 "$seed" --model gcn --layers 2
done
"$py" bench/pyg_accuracy.py "$data" --model gcnii --layers 32 --hidden 64 --alpha 0.1 --theta 0.5 --dropout 0.6 \
  --lr 0.01 --weight-decay 5e-4 --epochs 300 --seeds 0,1,2
