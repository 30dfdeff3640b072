#!/usr/bin/env bash
# Build what the GPU machine should run, and lay it out in .gpu/ at the repository root
# (ignored by .gitignore): the one folder that has to travel there with the working tree.
#
#   bench/pack.sh [extra cargo args, e.g. --features grinnder-cli/mpi,grinnder-engine/mpi]
#
# .gpu/bin/     release binaries of the workspace (stripped)
# .gpu/tests/   release test executables (stripped); run each with --test-threads=1
# .gpu/COMMIT   the commit they were built from (the bench/gpu_*.sh scripts print it)
# The bench scripts and datasets they use (bench/pyg_baseline.py, data/cora) travel with the
# working tree itself.
# The GPU machine may have no Rust toolchain and reach no registry: everything is built here.
# Binaries built here run there when its glibc is as new or newer. Keep .gpu/ under 64 MiB.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
rm -rf .gpu && mkdir -p .gpu/bin .gpu/tests
git rev-parse --short HEAD > .gpu/COMMIT
cargo build --release --workspace --bins "$@"
cargo test --release --workspace --no-run --message-format=json "$@" 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        print(m["executable"])' \
  | while read -r exe; do cp "$exe" .gpu/tests/; done
find target/release -maxdepth 1 -type f -perm -u+x -exec cp {} .gpu/bin/ \;
strip .gpu/bin/* .gpu/tests/* 2>/dev/null || true
du -sh .gpu
size=$(du -sm .gpu | cut -f1)
[ "$size" -lt 60 ] || echo "warning: .gpu is ${size} MiB; at most 64 MiB travel with the tree"
cat <<'MSG'
Now send .gpu/ along to the GPU machine and run there, for example:
  for t in .gpu/tests/*; do "$t" --test-threads=1 || exit 1; done
  .gpu/bin/grinnder ...
  bench/gpu_micro.sh
MSG
