#!/usr/bin/env bash
# On the GPU machine (after packing .gpu/): papers-like at SCALE (default 0.25) trained for 2
# epochs at 16 and at 64 partitions with train's defaults otherwise (GCN, 2 layers, hidden 256),
# and the losses' relative difference (issue 44: within 1e-5). Results under $OUT.
set -uo pipefail
out=${OUT:-/tmp/gpu-out}
scale=${SCALE:-0.25}
d=/tmp/gpu-data/papers-$scale-f16
mkdir -p "$out" "$d"
echo "date: $(date -u +%F)   commit: $(cat .gpu/COMMIT 2>/dev/null)   papers-like scale $scale"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -f "$d/g.grnd" ] || /usr/bin/time -f "generate: %e s" .gpu/bin/grinnder -q generate --preset papers-like \
  --scale "$scale" --seed 0 --feature-dtype f16 --out "$d/g.grnd"
for p in ${PARTS:-16 64}; do
  /usr/bin/time -f "parts $p: %e s wall, peak RSS %M kB" .gpu/bin/grinnder train "$d/g.grnd" --device cuda \
    --model gcn --layers 2 --hidden 256 --epochs 2 --parts "$p" --eval-every 0 --cache-dir "$d/cache" \
    --metrics-out "$out/parts-$p.jsonl" > "$out/parts-$p.log" 2>&1
  grep -E "plan:|epoch +[0-9]+:|error|panicked|wall" "$out/parts-$p.log" | cut -c1-300
done
python3 - "$out" ${PARTS:-16 64} <<'PY'
import json, sys
out, parts = sys.argv[1], sys.argv[2:]
losses = {p: [json.loads(l)["loss"] for l in open(f"{out}/parts-{p}.jsonl") if '"epoch"' in l] for p in parts}
a, b = losses[parts[0]], losses[parts[-1]]
print("losses", losses)
print("largest relative difference", max(abs(x - y) / abs(y) for x, y in zip(a, b)))
PY
