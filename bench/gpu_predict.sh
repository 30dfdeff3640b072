#!/usr/bin/env bash
# On the GPU machine, in ONE run (after bench/pack.sh here; from the repository root with
# .gpu carried): inference beside training on one generated graph, GCN with hidden 256.
#
#   bench/gpu_predict.sh PRESET "TRAIN FLAGS" "BUDGET FLAGS" [EMBED]
#
# 1. trains (the flags of gpu_ab.sh plus TRAIN FLAGS, evaluating every epoch) and saves the model;
# 2. predicts the logits with no budget (every node at once on the GPU);
# 3. predicts them under BUDGET FLAGS (and hidden layer 0's output with EMBED=1), twice in one
#    process (--repeat 2: the first pass also picks the SpMM kernels);
# 4. compares the two logits files.
# Prints each step's time and summary; the training epoch's forward pass is its evaluation
# (eval_s: the same forward without dropout, over the same partitions and budget).
set -uo pipefail
preset=$1
train_flags=$2
budget_flags=$3
embed=${4:-0}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
bin=.gpu/bin/grinnder
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "date: $(date -u +%F)   preset: $preset   train: $train_flags   budget: $budget_flags"
data=/tmp/gpu-data/$preset
mkdir -p "$data"
stamp() { echo "[$(date +%s)] $*"; }
stamp generate
[ -f "$data/g.grnd" ] || $bin -q generate --preset "$preset" --seed 0 --out "$data/g.grnd" || exit 1
common=(--device cuda --model gcn --layers 2 --hidden 256 --dropout 0 --input-dropout 0 --weight-decay 0
  --feature-norm none)
stamp train
# shellcheck disable=SC2086
$bin train "$data/g.grnd" "${common[@]}" $train_flags --eval-every 1 --save-model "$data/m.safetensors" \
  --metrics-out "$out/$preset-train.jsonl" > "$out/$preset-train.log" 2>&1 || { tail -3 "$out/$preset-train.log"; exit 1; }
tail -1 "$out/$preset-train.log"
python3 - "$out/$preset-train.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    if "final" not in m:
        print(f"train epoch {m['epoch']}: {m['epoch_s']:.4f} s, evaluation (the forward pass) {m['eval_s']:.4f} s, peak GPU {m['peak_device_bytes']/2**30:.2f} GiB")
PY
stamp predict, no budget
$bin predict "$data/g.grnd" --model-file "$data/m.safetensors" --device cuda --out "$data/whole" --repeat "${REPEAT:-2}" \
  --metrics-out "$out/$preset-whole.jsonl" 2>"$out/$preset-whole.log" || { tail -3 "$out/$preset-whole.log"; exit 1; }
extra=()
[ "$embed" = 1 ] && extra=(--embed 0)
stamp predict, "$budget_flags"
# shellcheck disable=SC2086
$bin predict "$data/g.grnd" --model-file "$data/m.safetensors" --device cuda --out "$data/budget" --repeat "${REPEAT:-2}" \
  $budget_flags "${extra[@]}" --metrics-out "$out/$preset-budget.jsonl" 2>"$out/$preset-budget.log" \
  || { tail -3 "$out/$preset-budget.log"; exit 1; }
stamp compare
python3 - "$out" "$preset" "$data" <<'PY'
import json, sys
import numpy as np
out, preset, data = sys.argv[1:]
for run in ("whole", "budget"):
    for l in open(f"{out}/{preset}-{run}.jsonl"):
        m = json.loads(l)
        t = m.get("tier") or {}
        print(f"predict {run:6} {m['output']:12} pass {m['pass']}: forward {m['compute_s']:.4f} s, writing {m['write_s']:.4f} s"
              f"{', to host ' + format(t['download_bytes']/2**20, '.0f') + ' MiB' if t else ''}")
a = np.load(f"{data}/whole/logits.npy", mmap_mode="r")
b = np.load(f"{data}/budget/logits.npy", mmap_mode="r")
scale = float(np.abs(a).max())
worst = 0.0
for s in range(0, a.shape[0], 1 << 20):
    worst = max(worst, float(np.abs(a[s:s + (1 << 20)] - b[s:s + (1 << 20)]).max()))
print(f"logits {a.shape}: budget against whole, largest difference {worst:.3g} at scale {scale:.4g} (relative {worst/scale:.3g})")
PY
ls -la "$data/whole" "$data/budget"
df -h /tmp | tail -1
stamp done
