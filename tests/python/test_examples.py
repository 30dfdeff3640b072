"""The examples run as a user would run them, and GriNNder's programmatic example written for
grinnder (examples/train_partitioned.py: partitions, the storage tier, an epoch loop) gives the
losses `grinnder train` gives with the same settings."""

import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("grinnder", reason="the grinnder package is not installed (pip install .)")


def example(name, *args):
    r = subprocess.run([sys.executable, str(ROOT / "examples" / name), *map(str, args)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, f"examples/{name} failed:\n{r.stderr}"
    return r.stdout


def test_the_partitioned_example_gives_the_cli_losses(grinnder, tmp_path):
    out = example("train_partitioned.py", "--epochs", 5)
    got = [float(x) for x in re.findall(r"loss (\d+\.\d+)", out)]
    m = tmp_path / "m.jsonl"
    grinnder("-q", "train", "--parts", 4, "--block-cache", 0, "--storage-dir", tmp_path, "--dropout", 0,
             "--hidden", 16, "--epochs", 5, "--metrics-out", m)
    want = [round(json.loads(l)["loss"], 4) for l in open(m) if "final" not in l]
    assert got == want
    assert "storage read 0.0 MiB" not in out, "blocks went through the storage tier"


def test_the_other_examples_run(tmp_path):
    pytest.importorskip("torch_geometric")
    assert "test accuracy" in example("train_from_pyg.py")
    assert "test accuracy" in example("predictions_to_pandas.py")
    out = example("beyond_memory.py", "data/cora", "--host-mem", "1GiB", "--storage-dir", tmp_path,
                  "--parts", 4, "--epochs", 2, "--out", tmp_path / "logits.npy")
    assert "logits written to" in out


def test_the_torch_model_example_trains_a_users_model_through_storage():
    pytest.importorskip("torch")
    out = example("torch_model.py", "--epochs", 25)
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", out)]
    assert losses[-1] < 0.5 * losses[0], out
    acc = float(re.search(r"test accuracy (\d\.\d+)", out).group(1))
    # (PyG's GCN on Cora: about 0.81 after 200 epochs)
    assert acc >= 0.7, out
