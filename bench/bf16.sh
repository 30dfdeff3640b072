#!/usr/bin/env bash
# Test accuracy of the tiered executor with f32 and bf16 blocks (`--tier-dtype`), Kipf &
# Welling settings, 4 METIS partitions, mean of three seeds, on Cora and PubMed.
# Usage: bench/bf16.sh [PUBMED_DIR]   (default: data/pubmed)
set -euo pipefail
cd "$(dirname "$0")/.."
pubmed=${1:-data/pubmed}
cargo build --release -q
bin=target/release/grinnder
cache=$(mktemp -d)
echo "date: $(date -u +%F)   commit: $(git rev-parse --short HEAD)   machine: $(nproc) cores"
run() { # name dataset args...
  local name=$1 data=$2; shift 2
  local accs=()
  for seed in 0 1 2; do
    acc=$(XDG_CACHE_HOME=$cache $bin -q train "$data" --seed $seed --parts 4 "$@" | sed -n 's/^test accuracy \([0-9.]*\) %.*/\1/p')
    accs+=("$acc")
  done
  python3 -c "import sys; a=[float(x) for x in sys.argv[2:]]; print(f'{sys.argv[1]:<34} seeds {a}  mean {sum(a)/len(a):.2f} %')" "$name" "${accs[@]}"
}
for dt in f32 bf16; do
  run "Cora GCN, P=4, $dt blocks" data/cora --model gcn --tier-dtype $dt
  run "Cora SAGE, P=4, $dt blocks" data/cora --model sage --tier-dtype $dt
  [ -d "$pubmed" ] && run "PubMed GCN, P=4, $dt blocks" "$pubmed" --model gcn --tier-dtype $dt
done
rm -rf "$cache"
