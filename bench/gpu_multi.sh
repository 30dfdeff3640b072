#!/usr/bin/env bash
# On a multi-GPU machine (after bench/pack.sh --features grinnder-cli/mpi,grinnder-engine/mpi):
# partition-parallel full-graph training on R GPUs (one MPI rank per GPU) against one GPU of the
# same machine, on one generated graph, in one call.
#
#   bench/gpu_multi.sh [PRESET] [EPOCHS]
#   MODELS="gcn gat:24GiB" models (2 layers, hidden 256, one GAT head), each with the --gpu-mem of
#                         its runs (default 120GiB: every block stays on its GPU; the one-GPU
#                         in-memory run gets it too where given)
#   RANKS="2"             rank counts (at most the GPU count)
#   TRANSPORTS="nccl mpi" halo rows and gradient sums: NCCL between GPUs, or MPI through the host
#   EXPANSIONS=""         also emulated servers of one rank each: e.g. "none preload eas"
#   SKIP_ONE=1            leave out the one-GPU runs
#   ONE_GPU="mem tiered"  which one-GPU runs: in-memory trainer, executor with R partitions
# Per run: seconds per epoch (median), the loss after each epoch, bytes exchanged, peak GPU memory
# (rank 0's). Logs and metrics under /tmp/gpu-multi; the scaling plot (speed-up of R GPUs with
# NCCL over the one-GPU run, per model) as $OUT/scaling-PRESET.png.
set -uo pipefail
preset=${1:-products-like}
epochs=${2:-5}
out=/tmp/gpu-multi
mkdir -p "$out" "${OUT:-/tmp/gpu-out}"
plot=()
bin=.gpu/bin/grinnder
# NVLink multicast stays off (KINDS.md)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c
nvidia-smi topo -m 2>/dev/null | head -$((gpus + 1))
echo "date: $(date -u +%F)   commit: $(head -1 .gpu/COMMIT 2>/dev/null)   preset: $preset   epochs: $epochs   GPUs: $gpus"
data=/tmp/gpu-data/$preset
mkdir -p "$data"
[ -f "$data/g.grnd" ] || $bin -q generate --preset "$preset" --seed 0 --out "$data/g.grnd"
export XDG_CACHE_HOME=/tmp/gpu-data/cache
root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
summary() { # metrics file
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
s = [r for r in rows if r.get("final")][-1]
ep = [r for r in rows if not r.get("final")]
c = ([r["comm"] for r in ep if r.get("comm")] or [None])[-1]
mib = lambda b: b / 2**20
line = f"{s['epoch_s_median']:.4f} s/epoch, peak GPU {(s.get('peak_device_bytes') or 0) / 2**30:.2f} GiB, losses " \
    + " ".join(f"{r['loss']:.6f}" for r in ep)
if c:
    line += (f"; per epoch: halo {mib(c['halo_intra_bytes']):.1f}+{mib(c['halo_inter_bytes']):.1f} MiB, "
             f"halo grads {mib(c['grad_intra_bytes']):.1f}+{mib(c['grad_inter_bytes']):.1f} MiB, "
             f"reduce {mib(c['reduce_intra_bytes']):.1f}+{mib(c['reduce_inter_bytes']):.1f} MiB (intra+inter), "
             f"{c['comm_s']:.4f} s exchanging")
print(line)
PY
}
run() { # tag ranks flags...
  local tag=$1 n=$2
  shift 2
  local cmd=($bin train "$data/g.grnd" --device cuda "$@" --metrics-out "$out/$preset-$tag.jsonl")
  if [ "$n" -gt 1 ]; then
    cmd=(mpirun -n "$n" --bind-to none "${root[@]}" -x NCCL_NVLS_ENABLE -x XDG_CACHE_HOME "${cmd[@]}")
  fi
  if timeout 500 "${cmd[@]}" > "$out/$preset-$tag.log" 2>&1; then
    printf "%-28s %s\n" "$tag" "$(summary "$out/$preset-$tag.jsonl")"
  else
    printf "%-28s failed: %s\n" "$tag" "$(grep -m2 -i "error\|panicked" "$out/$preset-$tag.log" | tr '\n' ' ')"
  fi
}
for spec in ${MODELS:-gcn gat:24GiB}; do
  IFS=: read -r model mem <<< "$spec"
  flags=(--model "$model" --layers 2 --hidden 256 --heads 1 --dropout 0 --input-dropout 0 --weight-decay 0
    --feature-norm none --epochs "$epochs" --eval-every "$epochs")
  echo "== $preset $model, 2 layers, hidden 256${mem:+, --gpu-mem $mem per GPU}"
  one=" ${ONE_GPU:-mem tiered} "; [ -z "${SKIP_ONE:-}" ] || one=" "
  [[ "$one" != *" mem "* ]] || run "$model-1gpu" 1 "${flags[@]}" ${mem:+--gpu-mem "$mem"}
  plot+=("$model:1=$out/$preset-$model-1gpu.jsonl")
  for r in ${RANKS:-2}; do
    [ "$r" -le "$gpus" ] || continue
    tiered=("${flags[@]}" --parts "$r" --gpu-mem "${mem:-120GiB}")
    [[ "$one" != *" tiered "* ]] || run "$model-1gpu-p$r" 1 "${tiered[@]}"
    for t in ${TRANSPORTS:-nccl mpi}; do
      run "$model-${r}gpu-$t" "$r" "${tiered[@]}" --transport "$t"
    done
    plot+=("$model:$r=$out/$preset-$model-${r}gpu-nccl.jsonl")
    for e in ${EXPANSIONS:-}; do
      run "$model-${r}gpu-servers-$e" "$r" "${tiered[@]}" --ranks-per-server 1 --expansion "$e"
    done
  done
done
[ -n "${SKIP_ONE:-}" ] || $bin plot-scaling "${plot[@]}" --title "$preset: GPUs with NCCL vs one GPU" \
  --out "${OUT:-/tmp/gpu-out}/scaling-$preset.png" > /dev/null || true
