"""Directed, weighted graphs between grinnder and PyG, on Cora with a quarter of its directed
edges dropped and the rest weighted (CPU):

(a) a GCN trained by `grinnder.Trainer` on `Dataset.from_arrays(..., edge_weight=w,
    directed=True)` and saved loads into PyG's `GCNConv` layers, which given the dataset's
    `edge_index()` and `edge_weight()` compute the logits grinnder predicts, in memory and by
    partitions (within 1e-5 of their largest magnitude), and not those of the graph without
    its weights or made symmetric;
(b) what cannot use the weights refuses them naming the fix: another model, a model file of a
    directed, weighted graph given an undirected or unweighted one, weights of another length.

Needs the package built into the Python running the tests (`pip install .`, or `maturin
develop`), and (a) torch and PyG; skipped, saying so, where they are missing (CI installs
them).
"""

import numpy as np
import pytest

gr = pytest.importorskip("grinnder", reason="the grinnder package is not installed (pip install .)")


def directed_weighted(cora):
    """Three quarters of Cora's directed edges, each weighing one of 0.25, 0.5, ..., 4 (an edge
    and its reverse alike, so that the arrays load made symmetric too)."""
    ei = cora["edge_index"]
    ei = np.ascontiguousarray(ei[:, np.random.default_rng(47).random(ei.shape[1]) < 0.75])
    return ei, weights(ei)


def weights(ei):
    lo, hi = np.minimum(ei[0], ei[1]), np.maximum(ei[0], ei[1])
    return (0.25 * (1 + (lo * 7919 + hi * 104729) % 16)).astype(np.float32)


def dataset(cora, ei, **kw):
    return gr.Dataset.from_arrays(ei, cora["x"], cora["y"], cora["train"], cora["valid"], cora["test"], **kw)


def pyg_logits(path, cora, edge_index, edge_weight):
    """PyG's GCNConv layers holding the model file's model, on `edge_index` and `edge_weight`."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
    from test_pyg_roundtrip import Stack, features

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    model = Stack("gcn", int(meta["in_features"]), int(meta["hidden"]), int(meta["classes"]), int(meta["layers"]))
    model.load_state_dict(load_file(str(path)), strict=True)
    model.eval()
    ei = torch.from_numpy(edge_index)
    ew = None if edge_weight is None else torch.from_numpy(edge_weight)
    with torch.no_grad():
        return model(features(cora, meta), ei, edge_weight=ew).numpy(), meta


def test_a_directed_weighted_gcn_gives_its_logits_in_pygs_gcnconv(cora, tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (.ci/test makes a venv with it)")
    pytest.importorskip("torch_geometric", reason="PyG is not installed (.ci/test makes a venv with it)")
    from test_pyg_roundtrip import assert_close

    ei, w = directed_weighted(cora)
    ds = dataset(cora, ei, edge_weight=w, directed=True)
    assert ds.directed and ds.num_edges == ei.shape[1]
    # the dataset's edges and weights are the arrays given, in CSR order
    got = dict(zip(map(tuple, ds.edge_index().T.tolist()), ds.edge_weight().tolist()))
    assert got == dict(zip(map(tuple, ei.T.tolist()), w.tolist()))
    t = gr.Trainer(ds, model="gcn", hidden=16, epochs=20, feature_norm="row")
    t.fit(progress=False)
    m = tmp_path / "m.safetensors"
    t.save(str(m))
    want, meta = pyg_logits(m, cora, ds.edge_index(), ds.edge_weight())
    assert (meta["directed"], meta["edge_weight"]) == ("true", "true")
    assert_close(gr.Trainer.load(str(m), ds).predict(), want, "in memory")
    assert_close(gr.Trainer.load(str(m), ds, parts=3).predict(), want, "3 partitions")
    # PyG given the arrays as they were given computes the same
    assert_close(pyg_logits(m, cora, ei, w)[0], want, "PyG on the given arrays")
    # the weights and the direction make the logits: without either PyG computes others
    sym = np.unique(np.concatenate([ei, ei[::-1]], axis=1), axis=1)
    for what, edges, ew in [("unweighted", ei, None), ("symmetric", sym, weights(sym))]:
        other, _ = pyg_logits(m, cora, edges, ew)
        assert np.abs(other - want).max() > 1e-2 * np.abs(want).max(), what


def test_weights_where_they_cannot_be_used_are_refused_naming_the_fix(cora, tmp_path):
    ei, w = directed_weighted(cora)
    ds = dataset(cora, ei, edge_weight=w, directed=True)
    for model, layer in [("sage", "SAGEConv"), ("gat", "GATConv"), ("gin", "GINConv")]:
        with pytest.raises(ValueError, match=f"{layer} has no edge_weight.*model=\"gcn\""):
            gr.Trainer(ds, model=model, epochs=1)
    with pytest.raises(ValueError, match="3 weights, but .* one weight per edge"):
        dataset(cora, ei, edge_weight=w[:3], directed=True)
    t = gr.Trainer(ds, model="gcn", hidden=16, epochs=2)
    t.fit(progress=False)
    m = str(tmp_path / "m.safetensors")
    t.save(m)
    with pytest.raises(ValueError, match="trained on a directed graph.*directed=True"):
        gr.Trainer.load(m, dataset(cora, ei, edge_weight=w))
    with pytest.raises(ValueError, match="trained with edge weights.*edge_weight="):
        gr.Trainer.load(m, dataset(cora, ei, directed=True))
