#!/usr/bin/env bash
# On the GPU machine, in ONE run (after bench/pack.sh here; from the repository root with .gpu
# carried): papers-like at SCALE with narrow features, trained by the new build (and by the
# baseline at .gpu/old/grinnder with OLD=1), with the flags given, each command's wall time,
# its epoch lines, phases and peaks.
#
#   SCALE=0.5 DTYPE=f16 [BAR=1] [PREDICT=1] [RATES=1] bench/gpu_papers.sh [TRAIN FLAGS...]   e.g. --parts 32 --gpu-mem 48GiB
#   (PREDICT=1: predict from the model trained, with predict's defaults; PREDICT_WHAT="class all" only that one)
#   (RATES=1: `bench rates --device cuda` first, so that train prints the cost model's epoch beside epoch 1's)
#   (BAR=1: train's defaults but the model; no flags: the budgets the run chooses from the machine; TAG names the run's files, so that
#   several runs of one call keep theirs)
# Results under $OUT (or /tmp/gpu-out).
set -uo pipefail
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
scale=${SCALE:-0.5}
data=/tmp/gpu-data/papers-$scale-${DTYPE:-f16}
mkdir -p "$data"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
free -g | head -2
df -h /tmp | tail -1
echo "date: $(date -u +%F)   commit: $(cat .gpu/COMMIT 2>/dev/null)   papers-like scale $scale, features ${DTYPE:-f16}"
if [ ! -f "$data/g.grnd" ]; then
  /usr/bin/time -f "generate: %e s, peak RSS %M kB" .gpu/bin/grinnder -q generate --preset papers-like \
    --scale "$scale" --seed 0 --feature-dtype "${DTYPE:-f16}" --out "$data/g.grnd"
  ls -la "$data/g.grnd"
fi
common=(--device cuda --model gcn --layers "${LAYERS:-2}" --hidden 256 --epochs "${EPOCHS:-2}"
  --cache-dir "$data/cache")
# BAR=1: the issue's command as written (every other setting its default); else no dropout,
# no weight decay, no evaluation, features as stored (the figures of BENCHMARKS.md's P runs)
[ -n "${BAR:-}" ] || common+=(--dropout 0 --input-dropout 0 --weight-decay 0 --feature-norm none --eval-every 0)
run() { # tag binary [flags...]
  local tag=$1 bin=$2
  shift 2
  echo "== $tag: $*"
  /usr/bin/time -f "$tag: %e s wall, peak RSS %M kB" "$bin" train "$data/g.grnd" "${common[@]}" "$@" \
    --metrics-out "$out/papers-$tag.jsonl" > "$out/papers-$tag.log" 2>&1
  grep -E "plan:|host:|GPU tier|setup done|epoch +[0-9]+:|predicted|peak|error|panicked|wall" "$out/papers-$tag.log" | cut -c1-400
  python3 - "$out/papers-$tag.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
except OSError:
    sys.exit()
for r in rows:
    # (the tiered executor's figures sit beside the epoch's, as --metrics-out writes them)
    if "epoch" in r and "gather_s" in r:
        print(f"  epoch {r['epoch']}: loss {r.get('loss')!r}  {r['epoch_s']:.2f} s + evaluation {r.get('eval_s') or 0:.2f} s"
              f"  gather {r['gather_s']:.2f}  compute {r['compute_s']:.2f}  write-back {r['write_back_s']:.2f}"
              f"  up {r['upload_bytes'] / 1e9:.1f} GB  down {r['download_bytes'] / 1e9:.1f} GB  host writes {r['host_write_bytes'] / 1e9:.1f} GB"
              f"  host peak {r['peak_host_bytes'] / 2**30:.1f} GiB  GPU peak {(r.get('peak_device_bytes') or 0) / 2**30:.1f} GiB")
PY
}
[ -z "${RATES:-}" ] || /usr/bin/time -f "bench rates: %e s wall" .gpu/bin/grinnder -q bench rates --device cuda
[ -z "${PREDICT:-}" ] || common+=(--save-model "$data/m.safetensors")
run "${TAG:-new}" .gpu/bin/grinnder "$@"
if [ -n "${PREDICT:-}" ]; then # PREDICT=1: every node's class, then the test split's logits
  IFS=, read -ra whats <<< "${PREDICT_WHAT:-class all,logits test}"
  for what in "${whats[@]}"; do
    set -- $what
    /usr/bin/time -f "predict $1 of $2: %e s wall, peak RSS %M kB" .gpu/bin/grinnder predict "$data/g.grnd" \
      --model-file "$data/m.safetensors" --device cuda --output "$1" --nodes "$2" --out "$data/pred-$1" \
      --cache-dir "$data/cache" > "$out/predict-$1.log" 2>&1
    grep -E "plan:|→|predicted|error|wall" "$out/predict-$1.log" | cut -c1-400
  done
fi
[ -z "${OLD:-}" ] || run old .gpu/old/grinnder "$@"
