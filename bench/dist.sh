#!/usr/bin/env bash
# Partition-parallel training with CPU ranks on this machine (Open MPI): 4 ranks emulating 2
# servers of 2 (--ranks-per-server 2), plain partition-parallel vs flexible preloading vs
# expansion-aware sampling, beside one process with the same partitions. Prints per run the
# median epoch, the bytes exchanged per epoch (halo rows, halo gradients, reductions; within
# and between servers) and the accuracy.
#   bench/dist.sh [PRESET:SCALE ...]     default: arxiv-like:1 products-like:0.05
# Accuracy runs: ACC=1 bench/dist.sh  (Cora and PubMed, 200 epochs, Kipf & Welling settings;
# EXPANSIONS="eas" to run fewer full-graph variants); also cooperative mini-batches
set -euo pipefail
cargo build --release --features mpi -q
bin=target/release/grinnder
out=${OUT:-/tmp/dist-bench}
mkdir -p "$out"
root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
mpi=(mpirun -n 4 --oversubscribe "${root[@]}")
summary() {  # metrics file → one line
  python3 - "$1" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
ep = [r for r in rows if not r.get("final")]
fin = [r for r in rows if r.get("final")][0]
t = statistics.median(r["epoch_s"] for r in ep[1:] or ep)
c = ep[-1].get("comm")
mb = lambda b: b / 2**20
if c:
    s = (f"halo {mb(c['halo_intra_bytes']):.1f}/{mb(c['halo_inter_bytes']):.1f} MiB, "
         f"grads {mb(c['grad_intra_bytes']):.1f}/{mb(c['grad_inter_bytes']):.1f} MiB, "
         f"reduce {mb(c['reduce_intra_bytes']):.1f}/{mb(c['reduce_inter_bytes']):.1f} MiB (within/between servers)")
else:
    s = "one process"
print(f"epoch {t:.3f} s; {s}; test {fin['test_acc']*100:.2f} %, loss {fin['final_loss']:.4f}")
PY
}
echo "machine: $(nproc) cores, $(uname -m); date: $(date -u +%F); commit: $(git rev-parse --short HEAD)"
if [ "${ACC:-}" = 1 ]; then
  for ds in data/cora data/pubmed; do
    for seed in 0 1 2; do
      f=(train "$ds" --model gcn --epochs 200 --seed "$seed" --parts 4)
      $bin -q "${f[@]}" --metrics-out "$out/acc-1.jsonl" >/dev/null
      echo "$ds seed $seed one process: $(summary "$out/acc-1.jsonl")"
      for e in ${EXPANSIONS:-none preload eas}; do
        "${mpi[@]}" $bin -q "${f[@]}" --ranks-per-server 2 --expansion $e --metrics-out "$out/acc-$e.jsonl" >/dev/null
        echo "$ds seed $seed 4 ranks, --expansion $e: $(summary "$out/acc-$e.jsonl")"
      done
      # cooperative batches: 2 servers of 2 ranks, 8 seeds per rank, fanouts 25,10
      m=(train "$ds" --model gcn --epochs 200 --seed "$seed" --mode minibatch --fanout 25,10 --batch-size 8)
      "${mpi[@]}" $bin -q "${m[@]}" --ranks-per-server 2 --metrics-out "$out/acc-coop.jsonl" >/dev/null
      echo "$ds seed $seed 4 ranks, cooperative batches: $(summary "$out/acc-coop.jsonl")"
    done
  done
  exit 0
fi
for spec in "${@:-arxiv-like:1 products-like:0.05}"; do
  for ps in $spec; do
    preset=${ps%%:*}; scale=${ps##*:}
    g=/tmp/dist-bench-$preset-$scale.grnd
    [ -f "$g" ] || $bin -q generate --preset "$preset" --scale "$scale" --seed 0 --out "$g"
    f=(train "$g" --model gcn --hidden 64 --dropout 0 --input-dropout 0 --weight-decay 0 --epochs 4 --eval-every 4 --parts 4 --threads 1)
    $bin -q "${f[@]}" --metrics-out "$out/$preset-1.jsonl" >/dev/null
    echo "$preset@$scale one process (1 thread): $(summary "$out/$preset-1.jsonl")"
    for e in none preload eas; do
      "${mpi[@]}" $bin -q "${f[@]}" --ranks-per-server 2 --expansion $e --metrics-out "$out/$preset-$e.jsonl" >/dev/null
      echo "$preset@$scale 4 ranks (1 thread each), --expansion $e: $(summary "$out/$preset-$e.jsonl")"
    done
  done
done
