#!/usr/bin/env bash
# Time to the first epoch (issue: time to first epoch at scale): a fresh run and a run with the
# partition cache warm, each log line stamped with the wall-clock seconds since the command
# started, and the setup's phases from --metrics-out.
#
#   [SCALE=0.1] bench/setup_phases.sh BIN OUT [PRESET] [PARTS] [-- extra train flags]
#
# BIN: the grinnder binary (.gpu/bin/grinnder on the GPU machine); OUT: a folder for the graph,
# the caches and the logs. Default: igb-medium-like at scale 1 (10 M nodes, 40 GB of features),
# 64 partitions, GCN hidden 256 on cuda with --gpu-mem 24GiB, 2 epochs.
set -euo pipefail
bin=$1 out=$2 preset=${3:-igb-medium-like} parts=${4:-64}
shift $(( $# < 4 ? $# : 4 ))
[ "${1:-}" = "--" ] && shift
extra=("$@")
[ ${#extra[@]} -gt 0 ] || extra=(--device cuda --gpu-mem 24GiB)
mkdir -p "$out"
# each line as it arrives, stamped with the seconds since this script started
t0=$(date +%s.%N)
stamp() { python3 -u -c 'import sys, time
t0 = float(sys.argv[1])
for line in sys.stdin:
    print(f"[{time.time() - t0:7.1f}s] {line}", end="", flush=True)' "$t0"; }
g=$out/$preset-${SCALE:-1}.grnd
if [ ! -f "$g" ]; then
  echo "== generate $preset"
  /usr/bin/time -f "generate: %e s, peak RSS %M KiB" "$bin" generate --preset "$preset" --scale "${SCALE:-1}" --seed 0 --out "$g" 2>&1 | stamp
fi
for run in cold warm; do
  echo "== $run cache: train $g --parts $parts ${extra[*]}"
  XDG_CACHE_HOME=$out/cache /usr/bin/time -f "$run run: %e s, peak RSS %M KiB" \
    "$bin" train "$g" --model gcn --layers 2 --hidden 256 --dropout 0 --input-dropout 0 \
    --weight-decay 0 --feature-norm none --epochs 2 --parts "$parts" "${extra[@]}" \
    --metrics-out "$out/$run.jsonl" 2>&1 | stamp
  python3 -c "import json,sys; l=[json.loads(x) for x in open(sys.argv[1])][-1]; print('$run setup:', ', '.join(f\"{p['phase']} {p['seconds']:.1f} s\" for p in l.get('setup', [])))" "$out/$run.jsonl"
done
