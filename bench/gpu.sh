#!/usr/bin/env bash
# On the GPU machine (after ../shared/gpu/pack.sh here; run from the repository root with .gpu
# carried): the CUDA tests, then grinnder on the GPU against PyG on the same generated graph.
# Usage: bench/gpu.sh [PRESET] [EPOCHS]; results under $OUT (or /tmp/gpu-out).
set -uo pipefail
preset=${1:-products-like}
epochs=${2:-10}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
bin=.gpu/bin/grinnder
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "date: $(date -u +%F)   commit: $(cat .gpu/COMMIT 2>/dev/null)"
for t in .gpu/tests/cuda-*; do echo "== $t"; "$t" --test-threads=1 2>&1 | tail -15; done
echo "== Cora, GCN on the GPU (Kipf & Welling settings)"
$bin -q train .gpu/shared/datasets/cora --device cuda --seed 0
data=/tmp/gpu-data
mkdir -p $data
$bin -q generate --preset "$preset" --seed 0 --out $data/g.grnd
$bin -q export $data/g.grnd --format npy --out $data/npy
for model in ${MODELS:-gcn sage gat}; do
  echo "== $preset $model, 2 layers, hidden 256, $epochs epochs: grinnder --device cuda"
  # the baseline's settings: raw features, no dropout or weight decay, lr 0.01, one GAT head
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > /tmp/mem.txt &
  smi=$!
  $bin train $data/g.grnd --device cuda --model $model --layers 2 --hidden 256 --heads 1 --dropout 0 \
    --input-dropout 0 --weight-decay 0 --feature-norm none --epochs "$epochs" --eval-every "$epochs" \
    --metrics-out "$out/$model.jsonl" 2>&1 | grep -v "^\s*$" | tail -2
  kill $smi
  echo "peak GPU memory in use (nvidia-smi, 100 ms samples): $(sort -n /tmp/mem.txt | tail -1) MiB"
  echo "== the same with PyG"
  timeout 300 python3 .gpu/shared/bench/pyg_baseline.py $data/npy --model $model --layers 2 --hidden 256 --epochs "$epochs" 2>&1 | tail -1
done
