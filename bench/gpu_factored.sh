#!/usr/bin/env bash
# On the GPU machine, in ONE run (after bench/pack.sh here; from the repository root with .gpu
# carried): the factored-values CUDA tests, then partition graphs with factored values against
# values per entry (GRINNDER_FACTORED=1 / 0) on products-like under a GPU budget, alternating.
#
#   bench/gpu_factored.sh [MODELS] [ROUNDS]      e.g. bench/gpu_factored.sh "gcn sage" 2
#   EXTRA="--input-dropout 0.5"                    flags added to every train
# Prints one line per run: model, GRINNDER_FACTORED, median epoch seconds, peak host GiB, loss.
set -uo pipefail
models=${1:-gcn sage}
rounds=${2:-2}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
bin=.gpu/bin/grinnder
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "date: $(date -u +%F)   commit: $(cat .gpu/COMMIT)"
if [ -x .gpu/tests/cuda ]; then .gpu/tests/cuda factored 2>&1 | tail -4; fi
if [ -x .gpu/tests/ops ]; then .gpu/tests/ops spmm_factored 2>&1 | tail -4; fi
data=/tmp/gpu-data/products-like
mkdir -p "$data"
[ -f "$data/g.grnd" ] || $bin -q generate --preset products-like --seed 0 --out "$data/g.grnd"
for r in $(seq "$rounds"); do
  for model in $models; do
    for f in 0 1; do
      m="$out/fv-$model-$f-$r.jsonl"
      # shellcheck disable=SC2086
      GRINNDER_FACTORED=$f $bin train "$data/g.grnd" --device cuda --model "$model" --hidden 256 \
        --layers 2 --parts 16 --gpu-mem 8GiB --epochs 4 --eval-every 0 ${EXTRA:-} \
        --metrics-out "$m" > "$out/fv-$model-$f-$r.log" 2>&1 || { echo "$model $f failed: $(tail -2 "$out/fv-$model-$f-$r.log")"; continue; }
      echo "$model factored=$f round $r: $(grep -E 'per epoch' "$out/fv-$model-$f-$r.log" | tail -1)"
    done
  done
done
