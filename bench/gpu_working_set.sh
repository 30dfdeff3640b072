#!/usr/bin/env bash
# On the GPU machine (after ../shared/gpu/pack.sh here; from the repository root with .gpu
# carried): the memory plan's GPU working set against the measured per-phase peaks, and the
# losses under tight budgets against the whole graph in GPU memory, on products-like.
#
#   bench/gpu_working_set.sh [EPOCHS]
#   BASE=.gpu/old/grinnder   also runs an older build's plan under the tightest budget
# Prints, per run: the GPU tier line, the largest measured working set against the plan's,
# the summary line (peak GPU memory) and the losses; full logs under $OUT (or /tmp/gpu-out).
set -uo pipefail
epochs=${1:-3}
bin=.gpu/bin/grinnder
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
data=/tmp/gpu-data/products-like
mkdir -p "$data"
[ -f "$data/g.grnd" ] || $bin -q generate --preset products-like --seed 0 --out "$data/g.grnd"
export RUST_LOG="info,grinnder_engine::tiered::schedule=trace,grinnder_engine::trainer=debug"
run() { # name binary flags...
  local name=$1 b=$2
  shift 2
  echo "== $name: $*"
  $b train "$data/g.grnd" --device cuda --epochs "$epochs" "$@" --metrics-out "$out/$name.jsonl" \
    > "$out/$name.log" 2>&1
  grep -E "GPU tier:|GPU working set measured|peak GPU|rror" "$out/$name.log" \
    | sed 's/(growth in a phase beyond the blocks it added), //' | tail -3
  python3 - "$out/$name.jsonl" <<'PY' 2>/dev/null
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"epoch"' in l]
print("losses:", " ".join(repr(r["loss"]) for r in rows if "loss" in r))
PY
}
gcn=(--model gcn --layers 2 --hidden 256)
run in-memory $bin "${gcn[@]}"
run gcn-p4-6g $bin "${gcn[@]}" --parts 4 --gpu-mem 6GiB
[ -n "${BASE:-}" ] && run gcn-p4-6g-base "$BASE" "${gcn[@]}" --parts 4 --gpu-mem 6GiB
run gcn-p2-10g $bin "${gcn[@]}" --parts 2 --gpu-mem 10GiB
run gcn-p2-8g $bin "${gcn[@]}" --parts 2 --gpu-mem 8GiB
run gcn-fused-p4-6g $bin "${gcn[@]}" --parts 4 --gpu-mem 6GiB --dropout 0 --input-dropout 0
run gcn3-pre $bin --model gcn --layers 3 --hidden 256 --parts 4 --gpu-mem 12GiB --input-dropout 0 --dropout 0.3
run sage-p4-6g $bin --model sage --layers 2 --hidden 256 --parts 4 --gpu-mem 6GiB
run sage3-pre-norm $bin --model sage --layers 3 --hidden 256 --parts 4 --gpu-mem 12GiB --input-dropout 0 --norm layer
run gin3-eps $bin --model gin --layers 3 --hidden 128 --train-eps --parts 4 --gpu-mem 12GiB --input-dropout 0
run gat-p8 $bin --model gat --layers 2 --hidden 32 --heads 4 --attn-dropout 0.3 --parts 8 --gpu-mem 16GiB
