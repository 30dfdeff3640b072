#!/usr/bin/env bash
# On the GPU machine, in ONE run (after bench/pack.sh here; from the repository root with .gpu
# carried): papers-like at SCALE with narrow features, trained by the new build (and by the
# baseline at .gpu/old/grinnder with OLD=1), with the flags given, each command's wall time,
# its epoch lines, phases and peaks.
#
#   SCALE=0.5 DTYPE=f16 bench/gpu_papers.sh [TRAIN FLAGS...]     e.g. --parts 32 --gpu-mem 48GiB
#   (no flags: the budgets the run chooses from the machine)
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
common=(--device cuda --model gcn --layers "${LAYERS:-2}" --hidden 256 --dropout 0 --input-dropout 0
  --weight-decay 0 --feature-norm none --epochs "${EPOCHS:-2}" --eval-every 0 --cache-dir "$data/cache")
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
    t = r.get("tier")
    if "epoch" in r and t:
        print(f"  epoch {r['epoch']}: {r['epoch_s']:.2f} s  gather {t['gather_s']:.2f}  compute {t['compute_s']:.2f}"
              f"  write-back {t['write_back_s']:.2f}  up {t['upload_bytes'] / 1e9:.1f} GB  down {t['download_bytes'] / 1e9:.1f} GB"
              f"  host peak {r['peak_host_bytes'] / 2**30:.1f} GiB  GPU peak {(r.get('peak_device_bytes') or 0) / 2**30:.1f} GiB")
PY
}
run new .gpu/bin/grinnder "$@"
[ -z "${OLD:-}" ] || run old .gpu/old/grinnder "$@"
