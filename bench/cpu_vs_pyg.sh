#!/usr/bin/env bash
# Full-graph epoch time and peak memory on the CPU, grinnder vs PyG, same graph, same threads,
# same machine, same run. PyG comes from a virtual environment made for this benchmark only:
#   python3 -m venv /tmp/pygvenv && /tmp/pygvenv/bin/pip install torch torch_geometric numpy
# Usage: bench/cpu_vs_pyg.sh [PRESET] [PYTHON] [THREADS] [EPOCHS]
set -euo pipefail
preset=${1:-arxiv-like}
py=${2:-/tmp/pygvenv/bin/python}
threads=${3:-2}
epochs=${4:-5}
cd "$(dirname "$0")/.."
cargo build --release -q
bin=target/release/grinnder
data=/tmp/grinnder-$preset-npy
[ -f "$data/edge_index.npy" ] || $bin -q generate --preset "$preset" --format npy --out "$data"
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); date: $(date -u +%F); commit: $(git rev-parse --short HEAD)"
echo "torch/PyG: $($py -c 'import torch, torch_geometric as g; print(torch.__version__, g.__version__)' 2>/dev/null)"
peak() { awk '/Maximum resident/{printf "%.2f", $6/1048576}' "$1"; }
for spec in "gcn 1" "sage 1" "gat 1"; do
  set -- $spec
  model=$1 heads=$2
  /usr/bin/time -v -o /tmp/pyg.time "$py" bench/pyg_baseline.py "$data" --model "$model" --heads "$heads" \
    --hidden 256 --layers 2 --epochs "$epochs" --device cpu --threads "$threads" > /tmp/pyg.json 2>/dev/null || true
  pyg=$(tail -1 /tmp/pyg.json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("epoch_s_median", "nan"))' 2>/dev/null || echo nan)
  /usr/bin/time -v -o /tmp/grn.time $bin -q --threads "$threads" train "$data" --model "$model" --heads "$heads" \
    --hidden 256 --layers 2 --epochs $((epochs + 1)) --dropout 0 --input-dropout 0 --weight-decay 0 \
    --feature-norm none --eval-every 1000 --metrics-out /tmp/grn.jsonl > /dev/null
  ours=$(tail -1 /tmp/grn.jsonl | python3 -c 'import json,sys; print(json.load(sys.stdin)["epoch_s_median"])')
  python3 -c "import sys; m,p,o,pm,om=sys.argv[1:]; p,o=float(p),float(o); print(f'{m:<5} PyG {p:.3f} s/epoch, {pm} GiB peak RSS | grinnder {o:.3f} s/epoch, {om} GiB | ratio {o/p:.2f}x')" \
    "$model" "$pyg" "$ours" "$(peak /tmp/pyg.time)" "$(peak /tmp/grn.time)"
done
