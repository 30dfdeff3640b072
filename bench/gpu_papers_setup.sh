#!/usr/bin/env bash
# On the GPU machine, in ONE run (after bench/pack.sh here; from the repository root with .gpu
# carried): papers-like at SCALE generated with narrow features, then its setup alone —
# partitioning cold at PARTS (time, peak RSS, bytes per directed edge) and `info`'s plan with
# no flags and with the flags given — each command's wall time and peak RSS.
#
#   SCALE=1 PARTS=64 [LAYERS=2] [GIVEN_LAYERS=3] bench/gpu_papers_setup.sh [INFO FLAGS...]
#   e.g. --tier-dtype bf16 (the second info's flags; GIVEN_LAYERS its layers)
# Results under $OUT (or /tmp/gpu-out). The generated file and the partition cache stay under
# /tmp/gpu-data for a call that follows at once (bench/gpu_papers.sh reads the same paths).
set -uo pipefail
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
scale=${SCALE:-1}
parts=${PARTS:-64}
data=/tmp/gpu-data/papers-$scale-${DTYPE:-f16}
mkdir -p "$data"
bin=.gpu/bin/grinnder
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
free -g | head -2
df -h /tmp | tail -1
echo "date: $(date -u +%F)   commit: $(cat .gpu/COMMIT 2>/dev/null)   papers-like scale $scale, features ${DTYPE:-f16}, $(nproc) cores"
step() { # tag command...  (wall time and peak RSS of one command, its log under $out)
  local tag=$1
  shift
  /usr/bin/time -f "$tag: %e s wall, peak RSS %M kB" "$@" > "$out/$tag.log" 2>&1
  local rc=$?
  grep -E "wall, peak RSS|error|panicked|plan|partitions:|budget|host:|GPU|machine|structure|seconds|edge_cut" "$out/$tag.log" | cut -c1-600
  echo "$tag: exit $rc"
}
if [ ! -f "$data/g.grnd" ]; then
  step generate "$bin" generate --preset papers-like --scale "$scale" --seed 0 \
    --feature-dtype "${DTYPE:-f16}" --out "$data/g.grnd"
  ls -la "$data/g.grnd"
  df -h /tmp | tail -1
fi
"$bin" info "$data/g.grnd" --skip-feature-checksums 2>&1 | head -12
# partitioning cold, on every core, written to the cache the training runs read
step partition "$bin" partition "$data/g.grnd" --skip-feature-checksums --parts "$parts" --json \
  --cache-dir "$data/cache"
cat "$out/partition.log" | head -3 | cut -c1-600
# info as train plans it: no flags (budgets from the machine), then the flags given
common=(--device cuda --model gcn --hidden 256 --cache-dir "$data/cache")
step info-default "$bin" info "$data/g.grnd" "${common[@]}" --layers "${LAYERS:-2}"
# within the device's 10 minutes a call (LIMIT seconds from the start of this script)
left=$(( ${LIMIT:-585} - SECONDS ))
[ "$#" -eq 0 ] || [ "$left" -lt 30 ] || step info-given timeout "$left" "$bin" info "$data/g.grnd" "${common[@]}" \
  --layers "${GIVEN_LAYERS:-${LAYERS:-2}}" "$@"
df -h /tmp | tail -1
