#!/usr/bin/env bash
# GIN's Cora test accuracy, grinnder and PyG side by side, same split, settings and seeds:
# 2 layers, hidden 64, dropout 0.5 after the hidden layer (none on the input, as PyG's GIN
# model), Adam lr 0.01 with weight decay 5e-4, 200 epochs, row-normalised features, ε = 0
# fixed; the test accuracy at the epoch of best validation accuracy, over seeds 0–9.
# Usage: bench/gin_accuracy.sh [GRINNDER_BINARY] [PYTHON with torch and torch_geometric]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/grinnder}
py=${2:-python3}
data=${TMPDIR:-/tmp}/grinnder-cora-npy
[ -f "$data/edge_index.npy" ] || "$bin" -q export data/cora --format npy --out "$data"
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); date: $(date -u +%F); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
for seed in 0 1 2 3 4 5 6 7 8 9; do
  "$bin" -q train "$data" --model gin --layers 2 --hidden 64 --dropout 0.5 --input-dropout 0 \
    --lr 0.01 --weight-decay 5e-4 --epochs 200 --seed "$seed" --metrics-out /tmp/gin-$seed.jsonl > /dev/null
  tail -1 /tmp/gin-$seed.jsonl | python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'grinnder_seed': $seed, 'test_acc': d['test_acc'], 'best_epoch': d['best_epoch']}))"
done
"$py" bench/pyg_accuracy.py "$data" --model gin --layers 2 --hidden 64 --dropout 0.5 --lr 0.01 \
  --weight-decay 5e-4 --epochs 200 --seeds 0,1,2,3,4,5,6,7,8,9
