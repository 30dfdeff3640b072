"""Shared fixtures of the Python tests: the grinnder binary and the bundled Cora as arrays.

The binary is $GRINNDER_BIN, else the newer of target/release/grinnder and target/debug/grinnder
(build it first: `cargo build`). Cora comes from the project's own copy (data/cora), exported by grinnder
itself to the npy exchange layout, so both sides read the same graph.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def binary() -> Path:
    env = os.environ.get("GRINNDER_BIN")
    if env:
        return Path(env)
    built = [p for p in (ROOT / "target" / b / "grinnder" for b in ("release", "debug")) if p.exists()]
    if built:
        # the newest build: the one made for the code under test
        return max(built, key=lambda p: p.stat().st_mtime)
    raise RuntimeError("no grinnder binary: run `cargo build` first, or set GRINNDER_BIN")


def run(*args) -> str:
    """Runs grinnder with `args` in the project root; its stdout, or the failure with stderr."""
    r = subprocess.run([str(binary()), *map(str, args)], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"grinnder {' '.join(map(str, args))} failed:\n{r.stderr}")
    return r.stdout


@pytest.fixture(scope="session")
def grinnder():
    return run


@pytest.fixture(scope="session")
def cora(tmp_path_factory):
    """Cora as grinnder reads it: symmetrised edges without self loops, raw features, labels
    and the public split."""
    out = tmp_path_factory.mktemp("cora")
    run("-q", "export", "data/cora", "--format", "npy", "--out", out)
    load = lambda name: np.load(out / f"{name}.npy")
    return {
        "edge_index": load("edge_index"),
        "x": load("node_feat"),
        "y": load("node_label"),
        "train": load("train_idx"),
        "valid": load("valid_idx"),
        "test": load("test_idx"),
    }
