#!/usr/bin/env bash
# On the GPU machine (after bench/pack.sh; from the repository root with .gpu carried):
# mini-batch SAGE (3 layers, hidden 256, fanout 15,10,5, batch 1024) on a generated preset with
# --feature-access copy and zero-copy in the same call; per-epoch phase lines and the summaries.
#   bench/gpu_minibatch.sh [PRESET] [EPOCHS] [extra train flags]
#   EVAL=0 bench/gpu_minibatch.sh igb-medium-like 3 --max-batches 150   (no evaluation: the
#   exact full-graph evaluation of igb-medium-like needs most of a 128 GB machine)
#   PYG=1 bench/gpu_minibatch.sh      also PyG's NeighborLoader on the same graph
#                                      (bench/pyg_minibatch.py; it needs pyg-lib or torch-sparse)
set -uo pipefail
preset=${1:-products-like}
epochs=${2:-3}
shift 2 2>/dev/null || shift $#
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
bin=.gpu/bin/grinnder
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "date: $(date -u +%F)   commit: $(cat .gpu/COMMIT 2>/dev/null)   cores: $(nproc)"
data=/tmp/gpu-data/$preset
mkdir -p "$data"
[ -f "$data/g.grnd" ] || $bin -q generate --preset "$preset" --seed 0 --out "$data/g.grnd"
for access in copy zero-copy; do
  echo "== --feature-access $access $*"
  $bin train "$data/g.grnd" --device cuda --model sage --layers 3 --hidden 256 --mode minibatch \
    --fanout 15,10,5 --batch-size 1024 --dropout 0 --input-dropout 0 --weight-decay 0 \
    --feature-norm none --epochs "$epochs" --eval-every "${EVAL:-$epochs}" --feature-access "$access" "$@" \
    --metrics-out "$out/mb-$preset-$access.jsonl" 2>&1 | grep -E "epoch [0-9]+:|accuracy|evaluated|second stream|error"
done
if [ -n "${PYG:-}" ]; then
  [ -f "$data/npy/train_idx.npy" ] || $bin -q export "$data/g.grnd" --format npy --out "$data/npy"
  echo "== PyG NeighborLoader (8 workers, pin_memory)"
  timeout 500 python3 bench/pyg_minibatch.py "$data/npy" --epochs "$epochs" --workers 8 2>&1 | tail -1
fi
