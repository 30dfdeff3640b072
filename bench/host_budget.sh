#!/usr/bin/env bash
# Features and blocks past the host budget (issue 28's 2-core bar), in one run: igb-medium-like
# at --scale 0.02 (200,000 nodes, 781 MiB of 1024-wide features), GCN-256 and SAGE-256 (2 layers,
# 16 partitions) under --host-mem 512MiB and under the least budget the plan accepts, against
# the in-memory trainer: peak RSS, every epoch's loss (relative difference), epoch time, and
# the bytes the storage tier read against those its callers asked for.
# Usage: bench/host_budget.sh [WORK_DIR] [EPOCHS]
set -euo pipefail
work=${1:-/tmp/grinnder-bench/host-budget}
epochs=${2:-3}
cd "$(dirname "$0")/.."
cargo build --release -q
bin=$PWD/target/release/grinnder
mkdir -p "$work/storage"
g=$work/igb-medium-like-0.02.grnd
[ -f "$g" ] || $bin -q generate --preset igb-medium-like --scale 0.02 --seed 1 --out "$g"
echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p')"
echo "date: $(date -u +%F)   commit: $(git rev-parse --short HEAD)   graph: $g ($(du -h "$g" | cut -f1))   storage: $(df -T "$work" | awk 'NR==2{print $2}')"
common=(--hidden 256 --dropout 0 --input-dropout 0 --feature-norm none --epochs "$epochs" --eval-every 0)
for m in gcn sage; do
  $bin -q train "$g" --model "$m" "${common[@]}" --metrics-out "$work/$m-memory.jsonl"
  # the refusal names the least budget the plan accepts
  least=$($bin -q train "$g" --model "$m" "${common[@]}" --parts 16 --storage-dir "$work/storage" --host-mem 1MiB 2>&1 |
    sed -n 's/.*needs at least \([0-9]*\) MiB.*/\1/p' || true)
  for budget in 512MiB "${least}MiB"; do
    NO_COLOR=1 $bin -v train "$g" --model "$m" "${common[@]}" --parts 16 --storage-dir "$work/storage" \
      --host-mem "$budget" --metrics-out "$work/$m-$budget.jsonl" 2> "$work/$m-$budget.err"
    python3 - "$work/$m-memory.jsonl" "$work/$m-$budget.jsonl" "$m" "$budget" "$work/$m-$budget.err" <<'PY'
import json, re, sys
ref, run, model, budget, err = sys.argv[1:]
def lines(f): return [json.loads(l) for l in open(f)]
a, b = lines(ref), lines(run)
la = [m["loss"] for m in a if "loss" in m and not m.get("final")]
lb = [m["loss"] for m in b if "loss" in m and not m.get("final")]
rel = max(abs(x - y) / abs(y) for x, y in zip(lb, la))
reads = re.findall(r"storage read ([0-9.]+) MiB \(([0-9.]+) MiB of it asked for", open(err).read())
print(f"{model} --host-mem {budget}: peak RSS {b[-1]['peak_host_bytes'] / 2**20:.0f} MiB, epoch "
      f"{b[-1]['epoch_s_median']:.2f} s (in memory {a[-1]['epoch_s_median']:.2f} s, peak "
      f"{a[-1]['peak_host_bytes'] / 2**20:.0f} MiB), losses max rel {rel:.1e} over {len(lb)} epochs, "
      f"storage read per epoch {reads[-1][0] if reads else '-'} MiB ({reads[-1][1] if reads else '-'} asked for)")
PY
  done
done
