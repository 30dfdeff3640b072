#!/usr/bin/env bash
# GATv2's test accuracy, grinnder and PyG side by side on PubMed's public split (a citation graph
# the project's tests do not train on), same settings and seeds: 2 layers, 8 heads of 8 in the
# hidden layer, dropout 0.6 (attention dropout the same), Adam lr 0.005 with weight decay 5e-4,
# 200 epochs, row-normalised features; the test accuracy at the epoch of best validation
# accuracy, seeds 0–4. PyG's model is its own GAT(v2=True) (its output layer averages 8 heads,
# grinnder's has one, as PyG's GAT example).
# Usage: bench/gatv2_accuracy.sh [GRINNDER_BINARY] [PYTHON with torch and torch_geometric] [PUBMED_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/grinnder}
py=${2:-python3}
pubmed=${3:-../shared/datasets/pubmed}
data=${TMPDIR:-/tmp}/grinnder-pubmed-npy
[ -f "$data/edge_index.npy" ] || "$bin" -q export "$pubmed" --format npy --out "$data"
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); date: $(date -u +%F); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
for seed in 0 1 2 3 4; do
  "$bin" -q train "$data" --model gatv2 --layers 2 --hidden 8 --heads 8 --dropout 0.6 --input-dropout 0 \
    --lr 0.005 --weight-decay 5e-4 --epochs 200 --seed "$seed" --metrics-out /tmp/gatv2-$seed.jsonl > /dev/null
  tail -1 /tmp/gatv2-$seed.jsonl | python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'grinnder_seed': $seed, 'test_acc': d['test_acc'], 'best_epoch': d['best_epoch']}))"
done
"$py" bench/pyg_accuracy.py "$data" --model gatv2 --layers 2 --hidden 8 --heads 8 --dropout 0.6 --lr 0.005 \
  --weight-decay 5e-4 --epochs 200 --seeds 0,1,2,3,4
