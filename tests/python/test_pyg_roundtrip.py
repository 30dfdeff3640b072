"""Model files between grinnder and PyG, both ways, on Cora (CPU):

(a) a model trained and saved by grinnder (`train --save-model`) loads into PyG's layers —
    GCNConv, SAGEConv, GATConv, GINConv, GATv2Conv and torch.nn.LayerNorm stacked as grinnder stacks them,
    PyG's BasicGNN models where they express the same model, and PyG's GCNII example model
    (GCN2Conv) — and gives the logits (and the first layer's output) that `grinnder predict` wrote;
(b) a model trained in PyG and saved with safetensors.torch.save_file under the documented names
    gives, through `grinnder predict`, the logits PyG computes.

Logits agree within 1e-5 of their largest magnitude (f32 arithmetic in different orders).
"""

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from torch_geometric.nn import GATConv, GATv2Conv, GCN2Conv, GCNConv, GINConv, SAGEConv
from torch_geometric.nn.models import GCN, GIN, GraphSAGE

TOL = 1e-5


class Stack(nn.Module):
    """grinnder's model in PyG's layers: for each hidden layer conv → [LayerNorm] → ReLU →
    [+ its input, where the widths match]; the output layer is a conv alone. (Dropout is off
    at inference.)"""

    def __init__(self, kind, in_dim, hidden, classes, layers, heads=1, norm=False, residual=False, eps=0.0,
                 train_eps=False):
        super().__init__()
        width = hidden * heads if kind in ("gat", "gatv2") else hidden
        dims = [in_dim] + [width] * (layers - 1) + [classes]
        self.residual = residual
        convs = []
        for l in range(layers):
            last = l + 1 == layers
            if kind == "gcn":
                convs.append(GCNConv(dims[l], dims[l + 1]))
            elif kind == "sage":
                convs.append(SAGEConv(dims[l], dims[l + 1]))
            elif kind in ("gat", "gatv2"):
                conv = GATConv if kind == "gat" else GATv2Conv
                convs.append(conv(dims[l], classes if last else hidden, heads=1 if last else heads, concat=not last))
            else:
                mlp = nn.Sequential(nn.Linear(dims[l], dims[l + 1]), nn.ReLU(), nn.Linear(dims[l + 1], dims[l + 1]))
                convs.append(GINConv(mlp, eps=eps, train_eps=train_eps))
        self.convs = nn.ModuleList(convs)
        self.norms = nn.ModuleList([nn.LayerNorm(width) for _ in range(layers - 1)]) if norm else None

    def forward(self, x, edge_index, upto=None, edge_weight=None):
        for l, conv in enumerate(self.convs[:upto]):
            # (GCNConv alone takes edge weights, as in grinnder)
            h = conv(x, edge_index) if edge_weight is None else conv(x, edge_index, edge_weight)
            if l + 1 < len(self.convs):
                if self.norms is not None:
                    h = self.norms[l](h)
                h = h.relu()
                if self.residual and h.shape[1] == x.shape[1]:
                    h = h + x
            x = h
        return x


class Gcnii(nn.Module):
    """PyG's GCNII example model (examples/gcn2_cora.py; dropout is off at inference, and the
    logits are taken before its log_softmax): x0 = relu(lins[0](x)), then L times
    x = relu(GCN2Conv(x, x0)), then lins[1](x)."""

    def __init__(self, in_dim, hidden, classes, layers, alpha, theta):
        super().__init__()
        self.lins = nn.ModuleList([nn.Linear(in_dim, hidden), nn.Linear(hidden, classes)])
        self.convs = nn.ModuleList([GCN2Conv(hidden, alpha, theta, l + 1) for l in range(layers)])

    def forward(self, x, edge_index, upto=None):
        x = x0 = self.lins[0](x).relu()
        for conv in self.convs[:upto]:
            x = conv(x, x0, edge_index).relu()
        return x if upto is not None else self.lins[1](x)


def features(cora, meta):
    """The model's input: Cora's features preprocessed as the model file's metadata says."""
    x = torch.from_numpy(cora["x"]).float()
    if meta.get("feature_norm", "none") == "row":
        x = x - float(meta.get("feature_shift", "0"))
        x = x / x.sum(dim=1, keepdim=True).clamp(min=1)
    return x


def assert_close(got, want, what):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shapes {got.shape} and {want.shape}"
    scale = max(np.abs(want).max(), 1e-30)
    worst = np.abs(got - want).max()
    assert worst <= TOL * scale, f"{what}: differs by {worst} at scale {scale}"


def metadata(path):
    with safe_open(str(path), "pt") as f:
        return f.metadata()


# (model, extra flags, layers): 3 layers where a residual needs a hidden layer of equal widths
GRINNDER_MODELS = [
    ("gcn", [], 2),
    ("gcn", ["--norm", "layer", "--residual"], 3),
    ("sage", [], 2),
    ("sage", ["--norm", "layer", "--residual"], 3),
    ("gat", ["--heads", "2"], 2),
    ("gat", ["--heads", "2", "--norm", "layer", "--residual"], 3),
    ("gatv2", ["--heads", "2"], 2),
    ("gin", ["--gin-eps", "0.1"], 2),
    ("gin", ["--train-eps", "--norm", "layer", "--residual"], 3),
    ("gcnii", ["--alpha", "0.2", "--theta", "1.0"], 4),
]


@pytest.mark.parametrize("kind,flags,layers", GRINNDER_MODELS)
def test_a_grinnder_model_gives_its_logits_in_pyg(grinnder, cora, tmp_path, kind, flags, layers):
    m = tmp_path / "m.safetensors"
    grinnder("-q", "train", "--model", kind, "--layers", layers, "--hidden", 16, "--epochs", 15, *flags,
             "--save-model", m)
    grinnder("-q", "predict", "--model-file", m, "--out", tmp_path / "out", "--embed", 0)
    meta = metadata(m)
    assert meta["model"] == kind and int(meta["layers"]) == layers
    state = load_file(str(m))
    if kind == "gcnii":
        model = Gcnii(int(meta["in_features"]), int(meta["hidden"]), int(meta["classes"]), layers,
                      alpha=float(meta["alpha"]), theta=float(meta["theta"]))
    else:
        model = Stack(kind, int(meta["in_features"]), int(meta["hidden"]), int(meta["classes"]), layers,
                      heads=int(meta["heads"]), norm=meta["norm"] == "layer", residual=meta["residual"] == "true",
                      eps=float(meta["gin_eps"]), train_eps=meta["train_eps"] == "true")
    model.load_state_dict(state, strict=True)
    model.eval()
    x, ei = features(cora, meta), torch.from_numpy(cora["edge_index"])
    with torch.no_grad():
        logits, first = model(x, ei), model(x, ei, upto=1)
    assert_close(np.load(tmp_path / "out" / "logits.npy"), logits, f"{kind} {flags} logits")
    assert_close(np.load(tmp_path / "out" / "embedding-0.npy"), first, f"{kind} {flags} layer 0")
    if flags in ([], ["--gin-eps", "0.1"]):
        # PyG's own models where they are the same model
        basic = {"gcn": GCN, "sage": GraphSAGE, "gin": GIN}.get(kind)
        if basic is not None:
            b = basic(int(meta["in_features"]), 16, layers, int(meta["classes"]),
                      **({"eps": float(meta["gin_eps"])} if kind == "gin" else {}))
            renamed = {k.replace(".nn.0.", ".nn.lins.0.").replace(".nn.2.", ".nn.lins.1."): v for k, v in state.items()}
            b.load_state_dict(renamed, strict=True)
            b.eval()
            with torch.no_grad():
                assert_close(np.load(tmp_path / "out" / "logits.npy"), b(x, ei), f"{kind} as PyG's {basic.__name__}")


def train_in_pyg(model, x, ei, y, train, epochs=10):
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x, ei)[train], y[train])
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return model(x, ei)


PYG_MODELS = [
    # (name, model builder, metadata: what the names and shapes cannot tell)
    ("gcn", lambda d, c: Stack("gcn", d, 16, c, 2), {}),
    ("sage-layernorm-residual", lambda d, c: Stack("sage", d, 16, c, 3, norm=True, residual=True),
     {"residual": "true"}),
    ("gat", lambda d, c: Stack("gat", d, 8, c, 2, heads=4), {}),
    ("gatv2", lambda d, c: Stack("gatv2", d, 8, c, 2, heads=4), {}),
    ("gin-basic", lambda d, c: GIN(d, 32, 2, c), {}),
    ("gcn-basic", lambda d, c: GCN(d, 32, 3, c), {}),
    # α and θ are not in the names: the metadata says them
    ("gcnii", lambda d, c: Gcnii(d, 16, c, 4, alpha=0.2, theta=1.0), {"alpha": "0.2", "theta": "1.0"}),
]


@pytest.mark.parametrize("name,build,extra", PYG_MODELS, ids=[m[0] for m in PYG_MODELS])
def test_a_pyg_model_gives_its_logits_in_grinnder(grinnder, cora, tmp_path, name, build, extra):
    torch.manual_seed(0)
    meta = {"feature_norm": "row", "feature_shift": "0", **extra}
    x, ei = features(cora, meta), torch.from_numpy(cora["edge_index"])
    y = torch.from_numpy(cora["y"]).long()
    model = build(x.shape[1], int(y.max()) + 1)
    want = train_in_pyg(model, x, ei, y, torch.from_numpy(cora["train"]).long())
    m = tmp_path / "pyg.safetensors"
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(m), metadata=meta)
    out = grinnder("predict", "--model-file", m, "--out", tmp_path / "out", "--parts", 3)
    assert_close(np.load(tmp_path / "out" / "logits.npy"), want, f"{name} in grinnder")
    acc = float((want.argmax(1)[torch.from_numpy(cora["y"]) >= 0] == y).float().mean())
    assert f"accuracy {100 * acc:.2f} %" in out, out


def test_a_pyg_file_without_metadata_runs_with_raw_features(grinnder, cora, tmp_path):
    torch.manual_seed(1)
    x, ei = torch.from_numpy(cora["x"]).float(), torch.from_numpy(cora["edge_index"])
    model = GraphSAGE(x.shape[1], 16, 2, int(cora["y"].max()) + 1).eval()
    with torch.no_grad():
        want = model(x, ei)
    m = tmp_path / "bare.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(m))
    grinnder("-q", "predict", "--model-file", m, "--out", tmp_path / "out")
    assert_close(np.load(tmp_path / "out" / "logits.npy"), want, "no metadata")
