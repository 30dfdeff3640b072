#!/usr/bin/env bash
# On the GPU machine, in ONE run (after bench/pack.sh here, with a baseline build at
# .gpu/old/grinnder; from the repository root with .gpu carried): full-graph epoch times of two
# builds on the same graph, alternating old and new so that drift hits both alike.
#
#   bench/gpu_ab.sh [PRESET] [EPOCHS] [ROUNDS]
#   RUNS="gcn: sage: gat:--gpu-mem=24GiB"   model:extra flags ('=' for a value, ',' between flags:
#                                           sage:--gpu-mem=8GiB,--parts=16)
# Prints one line per run: build, model, flags, median epoch seconds, its last epoch's
# gather / write-back seconds and bytes each way, test accuracy, final loss.
set -uo pipefail
preset=${1:-products-like}
epochs=${2:-10}
rounds=${3:-2}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
new=.gpu/bin/grinnder
old=.gpu/old/grinnder
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "date: $(date -u +%F)   preset: $preset   epochs: $epochs   rounds: $rounds"
data=/tmp/gpu-data/$preset
mkdir -p "$data"
[ -f "$data/g.grnd" ] || $new -q generate --preset "$preset" --seed 0 --out "$data/g.grnd"
common=(--layers 2 --hidden 256 --heads 1 --dropout 0 --input-dropout 0 --weight-decay 0
  --feature-norm none --epochs "$epochs" --eval-every "$epochs")
for r in $(seq "$rounds"); do
  for run in ${RUNS:-gcn: sage: gat:--gpu-mem=24GiB}; do
    model=${run%%:*}
    extra=${run#*:}
    extra=${extra//,/ }
    for build in old new; do
      bin=$old
      [ $build = new ] && bin=$new
      m="$out/$preset-$model-$build-$r.jsonl"
      # shellcheck disable=SC2086
      $bin train "$data/g.grnd" --device cuda --model "$model" "${common[@]}" ${extra:+$extra} \
        --metrics-out "$m" > "$out/$preset-$model-$build-$r.log" 2>&1 || { echo "$build $model failed: $(tail -1 "$out/$preset-$model-$build-$r.log")"; continue; }
      python3 - "$m" "$build" "$model" "$extra" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
s = rows[-1]
t = [r for r in rows if "epoch" in r][-1].get("tier") or {}
ph = (f"  gather {t.get('gather_s', 0):.3f} s  write-back {t.get('write_back_s', 0):.3f} s"
      f"  up {t.get('upload_bytes', 0) / 1e9:.2f} GB  down {t.get('download_bytes', 0) / 1e9:.2f} GB") if t else ""
print(f"{sys.argv[2]:4} {sys.argv[3]:5} {sys.argv[4]:28} epoch {s['epoch_s_median']:.5f} s{ph}  test {s['test_acc']:.4f}  loss {s['final_loss']:.5f}")
PY
    done
  done
done
