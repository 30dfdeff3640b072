#!/usr/bin/env bash
# Partitioner benchmark of issue "Partitioning", on this machine, in one run: every
# partitioner at every partition count as its own process, so that peak RSS (from
# /usr/bin/time) is that partitioner's alone (the mapped dataset included).
# Usage: [SEEDS="0 1 2"] bench/partition.sh [DATASET.grnd] [PARTS] [PARTITIONERS]
set -euo pipefail
file=${1:-/tmp/grinnder-bench/products-like.grnd}
parts=${2:-4,16,64}
methods=${3:-random contiguous metis multilevel spinner lpa}
seeds=${SEEDS:-0}
cd "$(dirname "$0")/.."
cargo build --release -q
bin=target/release/grinnder
if [ ! -f "$file" ]; then
  mkdir -p "$(dirname "$file")"
  $bin -q generate --preset products-like --seed 0 --out "$file"
fi
echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p')"
echo "date: $(date -u +%F)   commit: $(git rev-parse --short HEAD)   dataset: $file"
echo
echo "| partitioner | seed | P | balance | edge cut | halo volume | replication | time | peak RSS |"
echo "|---|---|---|---|---|---|---|---|---|"
for m in $methods; do
  for p in ${parts//,/ }; do
  for seed in $seeds; do
    log=$(mktemp)
    json=$(/usr/bin/time -v "$bin" -q partition "$file" --skip-feature-checksums --no-cache \
      --parts "$p" --partitioner "$m" --seed "$seed" --json 2>"$log")
    rss=$(awk '/Maximum resident set size/{printf "%.2f GB", $6/1e6}' "$log")
    rm -f "$log"
    python3 - "$m" "$json" "$rss" "$seed" <<'PY'
import json, sys
m, j, rss, seed = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"| {m} | {seed} | {j['parts']} | {j['balance']:.3f} | {j['edge_cut']:,} | {j['halo_volume']:,} | "
      f"{j['replication_factor']:.2f} | {j['seconds']:.1f} s | {rss} |")
PY
  done
done
done
