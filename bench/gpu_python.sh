#!/usr/bin/env bash
# On the GPU machine, in ONE run (from the repository root with .gpu carried, holding
# .gpu/bin/grinnder and the release wheel in .gpu/wheels/): the cost of driving training from
# Python (issue 27) — the same settings through `grinnder train` and through
# `grinnder.Trainer.train_epoch()` in a loop (bench/python_epochs.py), alternating, ROUNDS
# times each — and the peak RSS of from_arrays on the graph's numpy arrays
# (bench/from_arrays_rss.py).
#
#   bench/gpu_python.sh PRESET EPOCHS ROUNDS "BUDGET FLAGS" '{"budget": "keywords"}'
#
# Prints, per run, the median over epochs 2.. of the CLI's epoch_s + eval_s and of Python's
# call time (wall clock around train_epoch()) beside its epoch_s + eval_s.
set -uo pipefail
preset=$1 epochs=$2 rounds=$3 flags=$4 kw=$5
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
bin=.gpu/bin/grinnder
site=/tmp/grinnder-site
python3 -m pip install -q --no-deps --no-index --target "$site" .gpu/wheels/grinnder-*.whl || exit 1
export PYTHONPATH=$site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 --version
echo "date: $(date -u +%F)   preset: $preset   epochs: $epochs   budget: ${flags:-none}"
data=/tmp/gpu-data/$preset
mkdir -p "$data"
[ -f "$data/g.grnd" ] || $bin -q generate --preset "$preset" --seed 0 --out "$data/g.grnd" || exit 1
common=(--device cuda --model gcn --layers 2 --hidden 256 --heads 1 --dropout 0 --input-dropout 0
  --weight-decay 0 --feature-norm none --epochs "$epochs" --eval-every 1)
base='{"device": "cuda", "model": "gcn", "layers": 2, "hidden": 256, "heads": 1, "dropout": 0,
  "input_dropout": 0, "weight_decay": 0, "feature_norm": "none", "eval_every": 1}'
settings=$(python3 -c 'import json, sys; d = json.loads(sys.argv[1]); d.update(json.loads(sys.argv[2])); d["epochs"] = int(sys.argv[3]); print(json.dumps(d))' "$base" "$kw" "$epochs")
for r in $(seq "$rounds"); do
  # shellcheck disable=SC2086
  $bin -q train "$data/g.grnd" "${common[@]}" $flags --metrics-out "$out/cli-$r.jsonl" > "$out/cli-$r.log" 2>&1 \
    || { tail -3 "$out/cli-$r.log"; exit 1; }
  python3 bench/python_epochs.py "$data/g.grnd" "$settings" > "$out/py-$r.jsonl" 2> "$out/py-$r.log" \
    || { tail -3 "$out/py-$r.log"; exit 1; }
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def lines(p):
    return [json.loads(l) for l in open(p) if '"epoch"' in l and '"final"' not in l]
for r in range(1, rounds + 1):
    c, p = lines(f"{out}/cli-{r}.jsonl"), lines(f"{out}/py-{r}.jsonl")
    med = lambda xs: statistics.median(xs[2:])
    ce = med([m["epoch_s"] + m.get("eval_s", 0.0) for m in c])
    pe = med([m["epoch_s"] + m.get("eval_s", 0.0) for m in p])
    pc = med([m["call_s"] for m in p])
    same = all(a["loss"] == b["loss"] for a, b in zip(c, p))
    print(f"round {r}: CLI epoch+eval {ce:.5f} s | Python train_epoch() call {pc:.5f} s (engine epoch+eval {pe:.5f} s) "
          f"| call/CLI {pc / ce:.4f} | losses identical: {same} (last {c[-1]['loss']:.6f} / {p[-1]['loss']:.6f})")
PY
echo "--- from_arrays"
/usr/bin/time -v python3 bench/from_arrays_rss.py "$data/g.grnd" 2> "$out/rss.log"; grep -E "Maximum resident" "$out/rss.log"
