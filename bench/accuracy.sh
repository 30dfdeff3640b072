#!/usr/bin/env bash
# Accuracy of the in-memory trainer with the Kipf & Welling settings (the defaults of
# `grinnder train`: 2 layers, hidden 16, dropout 0.5, lr 0.01, weight decay 5e-4, 200 epochs,
# row-normalised features), mean of three seeds; then mini-batch SAGE beside full-graph SAGE
# (fanouts 25,10, batches of 32 seeds on Cora and 256 on PubMed, 100 epochs, exact evaluation).
# Usage: bench/accuracy.sh [PUBMED_DIR]   (default: data/pubmed)
set -euo pipefail
cd "$(dirname "$0")/.."
pubmed=${1:-data/pubmed}
cargo build --release -q
bin=target/release/grinnder
echo "date: $(date -u +%F)   commit: $(git rev-parse --short HEAD)   machine: $(nproc) cores"
run() { # name dataset args...
  local name=$1 data=$2; shift 2
  local accs=()
  for seed in 0 1 2; do
    acc=$($bin -q train $data --seed $seed "$@" | sed -n 's/^test accuracy \([0-9.]*\) %.*/\1/p')
    accs+=("$acc")
  done
  python3 -c "import sys; a=[float(x) for x in sys.argv[2:]]; print(f'{sys.argv[1]:<34} seeds {a}  mean {sum(a)/len(a):.2f} %')" "$name" "${accs[@]}"
}
run "Cora GCN" data/cora --model gcn
run "Cora SAGE" data/cora --model sage
run "Cora GAT (8 heads x 8)" data/cora --model gat --hidden 8 --heads 8
[ -d "$pubmed" ] && run "PubMed GCN" "$pubmed" --model gcn || echo "PubMed not found at $pubmed"
run "Cora SAGE mini-batch 25,10 x 32" data/cora --model sage --mode minibatch --fanout 25,10 --batch-size 32 --epochs 100
if [ -d "$pubmed" ]; then
  run "PubMed SAGE" "$pubmed" --model sage
  run "PubMed SAGE mini-batch 25,10 x 256" "$pubmed" --model sage --mode minibatch --fanout 25,10 --batch-size 256 --epochs 100
fi
