#!/usr/bin/env bash
# On the GPU machine (after bench/pack.sh --features grinnder-cli/mpi,grinnder-engine/mpi):
# full-graph GCN on a generated preset in one process and as 2 MPI ranks sharing the GPU
# (partition-parallel, halo rows through MPI on the host); same partitions, same flags.
#   bench/gpu_mpi.sh [PRESET] [EPOCHS] [RANKS]
set -uo pipefail
preset=${1:-products-like}
epochs=${2:-3}
ranks=${3:-2}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
bin=.gpu/bin/grinnder
echo "date: $(date -u +%F)   commit: $(head -1 .gpu/COMMIT 2>/dev/null)   preset: $preset"
data=/tmp/gpu-data/$preset
mkdir -p "$data"
[ -f "$data/g.grnd" ] || $bin -q generate --preset "$preset" --seed 0 --out "$data/g.grnd"
flags=(train "$data/g.grnd" --device cuda --model gcn --hidden 256 --dropout 0 --input-dropout 0
  --weight-decay 0 --feature-norm none --epochs "$epochs" --eval-every "$epochs" --parts 4)
# the first run partitions and caches; the ranks' rank 0 finds it
export XDG_CACHE_HOME=/tmp/gpu-data/cache
echo "== one process"
$bin "${flags[@]}" --metrics-out "$out/mpi-1.jsonl" 2>&1 | grep -E "test accuracy|error"
root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
echo "== mpirun -n $ranks"
mpirun -n "$ranks" --oversubscribe --bind-to none "${root[@]}" $bin "${flags[@]}" --metrics-out "$out/mpi-$ranks.jsonl" 2>&1 \
  | grep -E "test accuracy|exchanged|error" | tail -4
