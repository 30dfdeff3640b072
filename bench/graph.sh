#!/usr/bin/env bash
# Graph benchmarks of issue "Graphs and datasets", on this machine, in one run:
#   1. `grinnder generate --preset products-like` end to end (edges/s, file written);
#   2. loading that native file (open + verify every checksum + structural checks) against
#      `dd` reading the same file, cold (page cache dropped; needs root) and warm.
# Usage: bench/graph.sh [PRESET] [OUT_DIR] [REPEATS]
set -euo pipefail
preset=${1:-products-like}
out=${2:-/tmp/grinnder-bench}
reps=${3:-3}
cd "$(dirname "$0")/.."
cargo build --release -q
bin=target/release/grinnder
mkdir -p "$out"
file="$out/$preset.grnd"
echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p')"
echo "date: $(date -u +%F)   commit: $(git rev-parse --short HEAD)"
echo
echo "== generate --preset $preset"
for r in $(seq "$reps"); do
  rm -f "$file"
  $bin generate --preset "$preset" --seed 0 --out "$file" 2>&1 | grep -o 'generated and wrote.*' || true
done
size=$(stat -c %s "$file")
echo "file: $file, $size bytes"
echo
can_drop=0
if [ "$(id -u)" = 0 ] && sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then can_drop=1; fi
secs() { python3 -c "import sys; print(f'{float(sys.argv[1]):.3f}')" "$1"; }
gbps() { python3 -c "import sys; print(f'{int(sys.argv[1])/float(sys.argv[2])/1e9:.2f}')" "$size" "$1"; }
dd_secs() { dd if="$file" of=/dev/null bs=16M 2>&1 | awk '/copied/{print $(NF-3)}'; }
load_secs() { $bin -q info --json "$file" | python3 -c 'import json,sys; print(json.load(sys.stdin)["load_seconds"])'; }
echo "== load native file vs dd (same file, alternating)"
printf '%-6s %-5s %10s %9s %10s %9s\n' run cache "dd s" "dd GB/s" "load s" "load GB/s"
for r in $(seq "$reps"); do
  for cache in cold warm; do
    if [ $cache = cold ]; then
      [ $can_drop = 1 ] || continue
      sync; echo 3 > /proc/sys/vm/drop_caches
    fi
    d=$(dd_secs)
    [ $cache = cold ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
    l=$(load_secs)
    printf '%-6s %-5s %10s %9s %10s %9s\n' "$r" "$cache" "$(secs "$d")" "$(gbps "$d")" "$(secs "$l")" "$(gbps "$l")"
  done
done
[ $can_drop = 1 ] || echo "(cold runs skipped: dropping the page cache needs root)"
