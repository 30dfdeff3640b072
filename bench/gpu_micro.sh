#!/usr/bin/env bash
# On the GPU machine (after bench/pack.sh; from the repository root with .gpu carried):
# the CUDA tests, Cora on the GPU, and the microbenchmarks (`grinnder bench gather | transfer |
# launches | gemm | spmm | sample`, JSON; gemm at a mini-batch's layer-0 shapes) on a generated
# preset. Results under $OUT (or /tmp/gpu-out).
#   bench/gpu_micro.sh [PRESET]
set -uo pipefail
preset=${1:-products-like}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
bin=.gpu/bin/grinnder
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "date: $(date -u +%F)   commit: $(cat .gpu/COMMIT 2>/dev/null)"
for t in .gpu/tests/cuda-*; do
  echo "== $t"
  "$t" --test-threads=1 > "$out/tests-cuda.txt" 2>&1
  grep -E "^test |test result|panicked|error" "$out/tests-cuda.txt"
done
echo "== Cora, GCN on the GPU (Kipf & Welling settings)"
$bin -q train data/cora --device cuda --seed 0
$bin bench gather | tee "$out/bench-gather.json"
$bin bench transfer | tee "$out/bench-transfer.json"
$bin bench launches | tee "$out/bench-launches.json"
$bin bench gemm --m 140000 --k 100 --n 256 | tee "$out/bench-gemm-forward.json"
$bin bench gemm --m 256 --k 140000 --n 100 | tee "$out/bench-gemm-weight-gradient.json"
data=/tmp/gpu-data/$preset
mkdir -p "$data"
[ -f "$data/g.grnd" ] || $bin -q generate --preset "$preset" --seed 0 --out "$data/g.grnd"
$bin bench spmm "$data/g.grnd" | tee "$out/bench-spmm-$preset.json"
$bin bench sample "$data/g.grnd" --max-batches 96 | tee "$out/bench-sample-$preset.json"
