#!/usr/bin/env bash
# On the GPU machine, in ONE run (after bench/pack.sh here; from the repository root with
# .gpu carried): generate a preset, export it as npy, train each model with PyG
# (bench/pyg_baseline.py) and with grinnder on the same graph, and print both figures
# and their ratio. Then the runs under a GPU memory budget (PyG has no such mode).
#
#   bench/gpu_side_by_side.sh [PRESET] [EPOCHS]
#   MODELS="gcn sage gat"              models run all in GPU memory, both tools (MODELS= : none,
#                                      and no npy export: igb-medium-like's would not fit the disk)
#   BUDGETS="gcn:8GiB gat:24GiB"       grinnder runs with --gpu-mem (model:bytes[:parts])
#   SEED=0 SCALE=1                     generator seed and scale
# Results (JSON lines) under $OUT (or /tmp/gpu-out).
set -uo pipefail
preset=${1:-products-like}
epochs=${2:-10}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
bin=.gpu/bin/grinnder
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "date: $(date -u +%F)   commit: $(cat .gpu/COMMIT 2>/dev/null)   preset: $preset   epochs: $epochs"
data=/tmp/gpu-data/$preset
mkdir -p "$data"
[ -f "$data/g.grnd" ] || $bin -q generate --preset "$preset" --seed "${SEED:-0}" --scale "${SCALE:-1}" --out "$data/g.grnd"
models=${MODELS-gcn sage gat}
[ -z "$models" ] || [ -d "$data/npy" ] || $bin -q export "$data/g.grnd" --format npy --out "$data/npy"
# the baseline's settings: raw features, no dropout or weight decay, lr 0.01, one GAT head
common=(--layers 2 --hidden 256 --heads 1 --dropout 0 --input-dropout 0 --weight-decay 0
  --feature-norm none --epochs "$epochs" --eval-every "$epochs")
grinnder() { # model tag [extra flags...]
  local model=$1 tag=$2
  shift 2
  $bin train "$data/g.grnd" --device cuda --model "$model" "${common[@]}" "$@" \
    --metrics-out "$out/$preset-$tag.jsonl" > "$out/$preset-$tag.log" 2>&1
  grep -v "^\s*$" "$out/$preset-$tag.log" | tail -1
  python3 - "$out/$preset-$tag.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
s = rows[-1]
print(json.dumps({"tool": "grinnder", "epoch_s_median": s["epoch_s_median"],
  "peak_gpu_gib": (s.get("peak_device_bytes") or 0) / 2**30, "test_acc": s["test_acc"],
  "final_loss": s["final_loss"]}))
PY
}
for model in $models; do
  echo "== $preset $model, 2 layers, hidden 256, $epochs epochs"
  timeout 400 python3 bench/pyg_baseline.py "$data/npy" --model "$model" --layers 2 --hidden 256 \
    --epochs "$epochs" > "$out/$preset-$model-pyg.json" 2> "$out/$preset-$model-pyg.err"
  pyg=$(tail -1 "$out/$preset-$model-pyg.json")
  [ -n "$pyg" ] && echo "PyG      $pyg" || echo "PyG      failed: $(grep -m1 -o 'OutOfMemoryError\|out of memory' "$out/$preset-$model-pyg.err" || tail -1 "$out/$preset-$model-pyg.err")"
  g=$(grinnder "$model" "$model" | tail -1)
  echo "grinnder $g"
  python3 - "$pyg" "$g" <<'PY'
import json, sys
try:
    p, g = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    print(f"ratio grinnder/PyG epoch time: {g['epoch_s_median'] / p['epoch_s_median']:.3f}  "
          f"(test acc PyG {p['test_acc']:.4f}, grinnder {g['test_acc']:.4f})")
except Exception:
    pass
PY
done
for b in ${BUDGETS:-}; do
  IFS=: read -r model mem parts <<< "$b"
  echo "== $preset $model with --gpu-mem $mem ${parts:+--parts $parts}"
  tag="$model-$mem${parts:+-p$parts}"
  grinnder "$model" "$tag" --gpu-mem "$mem" ${parts:+--parts "$parts"} | tail -1
  grep -E "GPU tier|epoch +[0-9]+:|peak host" "$out/$preset-$tag.log" | head -20
done
