#!/usr/bin/env bash
# Tiered-executor benchmarks of issue "The tiered executor", on this machine, in one run:
#   (a) products-like GCN (2 layers, hidden 256), P partitions all in RAM vs the in-memory
#       trainer: epoch time;
#   (b) the same with a host budget that forces the storage tier: tier read and write
#       throughput vs `dd` with O_DIRECT on the same directory;
#   (c) peak RSS of every run (against --host-mem where given).
# Usage: bench/tiered.sh [DATASET.grnd] [STORAGE_DIR] [HOST_MEM] [PARTS] [EPOCHS]   (SKIP_RAM=1: skip (a))
set -euo pipefail
file=${1:-/tmp/grinnder-bench/products-like.grnd}
storage=${2:-/tmp/grinnder-bench/tier}
host_mem=${3:-8GiB}
parts=${4:-8}
epochs=${5:-3}
cd "$(dirname "$0")/.."
cargo build --release -q
bin=target/release/grinnder
if [ ! -f "$file" ]; then
  mkdir -p "$(dirname "$file")"
  $bin -q generate --preset products-like --seed 0 --out "$file"
fi
mkdir -p "$storage"
out=$(mktemp -d)
echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p')"
echo "date: $(date -u +%F)   commit: $(git rev-parse --short HEAD)   dataset: $file   storage: $storage ($(df -T "$storage" | awk 'NR==2{print $2}'))"
common=(train "$file" --skip-feature-checksums --model gcn --layers 2 --hidden 256 --dropout 0.5
  --input-dropout 0 --epochs "$epochs" --eval-every 1)
run() { # name, extra flags...
  local name=$1; shift
  /usr/bin/time -v "$bin" "${common[@]}" --metrics-out "$out/$name.jsonl" "$@" > "$out/$name.out" 2> "$out/$name.err" || {
    cat "$out/$name.err"; exit 1; }
  grep -h "INFO.*partitions;" "$out/$name.err" | sed 's/.*INFO[^ ]* //' || true
  python3 - "$name" "$out/$name.jsonl" "$out/$name.err" <<'PY'
import json, re, sys
name, path, err = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
ep = [r for r in rows if "epoch" in r]
times = sorted(r["epoch_s"] for r in ep)
rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(err).read()).group(1)) * 1024
line = f"{name}: epoch {times[len(times)//2]:.2f} s (median of {len(times)}; all {', '.join(f'{t:.2f}' for t in times)}), loss {ep[-1]['loss']:.4f}, peak RSS {rss/2**30:.2f} GiB"
if "storage_read_bytes" in ep[-1]:
    rb = sum(r["storage_read_bytes"] for r in ep); wb = sum(r["storage_write_bytes"] for r in ep)
    rs = sum(r["read_s"] for r in ep); ws = sum(r["write_s"] for r in ep)
    g = sum(r["gather_s"] for r in ep); c = sum(r["compute_s"] for r in ep); w = sum(r["write_back_s"] for r in ep)
    line += f"; gather {g:.1f} s, compute {c:.1f} s, write-back {w:.1f} s"
    if rb or wb:
        line += f"; storage read {rb/1e9:.2f} GB in {rs:.1f} s = {rb/max(rs,1e-9)/1e9:.2f} GB/s, write {wb/1e9:.2f} GB in {ws:.1f} s = {wb/max(ws,1e-9)/1e9:.2f} GB/s"
print(line)
PY
}
if [ -z "${SKIP_RAM:-}" ]; then  # SKIP_RAM=1: only (b) and dd
  echo
  echo "== (a) in RAM"
  run memory
  run "tiered-P$parts" --parts "$parts"
fi
echo
echo "== (b) storage tier forced: --host-mem $host_mem"
run "tiered-P$parts-storage" --parts "$parts" --host-mem "$host_mem" --storage-dir "$storage" --cache-mode partition_lru
echo
echo "== dd with O_DIRECT on $storage (4 GiB, 1 MiB blocks)"
dd if=/dev/zero of="$storage/dd.bin" bs=1M count=4096 oflag=direct 2>&1 | tail -1
dd if="$storage/dd.bin" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1
rm -f "$storage/dd.bin"
rm -rf "$out"
