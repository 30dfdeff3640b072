"""Your PyTorch model past the memory wall: its layers run by grinnder's tiered executor,
partition by partition, with your optimizer and your loss, the gradients those of whole-graph
training.

A model is a `LayerwiseModel`: `layer_dims()` gives the widths `[in, ..., out]` and
`forward_layer(l, x, adj)` computes layer `l` — its activation, norm and dropout included —
for the rows of one partition:

- `x`: the input rows the partition's layer reads, **its own rows first, in the order of
  `adj`'s rows, then its halo** (the neighbours it reads from other partitions);
- `adj`: a torch sparse CSR tensor, the partition's rows by `x`'s rows, whose values are the
  whole graph's `Â = D̂^{-1/2} (A + I) D̂^{-1/2}` (GCN's normalisation, as GriNNder gives its
  layers; a model's `adjacency = "mean"` or `"sum"` asks for SAGE's or GIN's instead);
- it returns the partition's output rows (`adj.shape[0]` of them).

    import torch, grinnder
    from grinnder.torch import LayerwiseModel, Trainer

    class Gated(LayerwiseModel):
        def __init__(self, dims):
            super().__init__()
            self.dims = dims
            self.lins = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        def layer_dims(self):
            return self.dims
        def forward_layer(self, l, x, adj):
            h = adj @ self.lins[l](x)
            return h if l == len(self.lins) - 1 else torch.relu(h)

    ds = grinnder.load_dataset("data/cora")
    model = Gated([ds.num_features, 64, ds.num_classes])
    t = Trainer(model, ds, parts=4, storage_dir="/tmp/blocks")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(100):
        print(t.train_epoch(opt, torch.nn.CrossEntropyLoss())["loss"])
    logits = t.predict()

Each epoch runs every layer forward over every partition (blocks in host memory or files, as
`grinnder.Trainer`'s settings say), gives your criterion the output rows of the whole train
split at once (so any reduction, class weights, multi-label and regression targets give the
whole graph's loss), then runs backward layer by layer: `forward_layer` again under autograd
for each partition, the output's gradient fed in, parameter gradients accumulating in `.grad`,
the input rows' gradients summed into the layer below's. Then your optimizer steps.

Dropout inside `forward_layer` draws the same mask in a layer's forward and its backward
(torch's generator is seeded per epoch, layer and partition); the masks are not those of a
whole-graph run. So far the layers run on the CPU, and rows cross between the engine and torch
as copies. `GCN`, `GraphSAGE` and `GAT` here are PyG's models of those names as
`LayerwiseModel`s, with PyG's parameter names.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import torch

from . import _grinnder

__all__ = ["GAT", "GCN", "GraphSAGE", "LayerwiseModel", "Trainer", "adjacency"]


class LayerwiseModel(torch.nn.Module):
    """A model given layer by layer (see the module): subclasses define `layer_dims()` and
    `forward_layer(l, x, adj)`; `forward(x, adj)` runs every layer on the whole graph, as
    plain PyTorch training would.

    `adjacency` says which matrix `adj` holds: `"gcn"` (the default) `Â = D̂^{-1/2} (A + I)
    D̂^{-1/2}`; `"mean"` the mean over in-neighbours (`1 / in-degree`, no self loops: SAGE's);
    `"sum"` `A` itself (GIN's)."""

    adjacency = "gcn"

    def layer_dims(self) -> Sequence[int]:
        """Widths `[in, hidden..., out]`: layer `l` maps `dims[l]` columns to `dims[l + 1]`."""
        raise NotImplementedError("a LayerwiseModel defines layer_dims()")

    def forward_layer(self, layer: int, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s output rows (`adj.shape[0]`) from its input rows `x` (own rows
        first, then the halo) and the adjacency `adj` (rows by `x`'s rows)."""
        raise NotImplementedError("a LayerwiseModel defines forward_layer(layer, x, adj)")

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        for layer in range(len(self.layer_dims()) - 1):
            x = self.forward_layer(layer, x, adj)
        return x


def adjacency(dataset: "_grinnder.Dataset", kind: str = "gcn") -> torch.Tensor:
    """The whole graph's adjacency of `kind` (`LayerwiseModel.adjacency`) as a torch sparse CSR
    tensor, rows the targets (what `forward_layer` gets a partition's rows of): for whole-graph
    reference runs."""
    n = dataset.num_nodes
    ei = torch.from_numpy(np.asarray(dataset.edge_index()))
    rows, cols = ei[1], ei[0]
    w = dataset.edge_weight()
    vals = (torch.from_numpy(np.asarray(w, dtype=np.float64)) if w is not None
            else torch.ones(ei.shape[1], dtype=torch.float64))
    if kind == "gcn":
        loops = torch.arange(n, dtype=ei.dtype)
        rows, cols = torch.cat([rows, loops]), torch.cat([cols, loops])
        vals = torch.cat([vals, torch.ones(n, dtype=torch.float64)])
        dinv = torch.zeros(n, dtype=torch.float64).index_add_(0, rows, vals).pow(-0.5)
        vals = dinv[rows] * vals * dinv[cols]
    elif kind == "mean":
        deg = torch.zeros(n, dtype=torch.float64).index_add_(0, rows, vals)
        vals = vals / deg[rows]
    elif kind != "sum":
        raise ValueError(f"adjacency {kind!r}: one of \"gcn\", \"mean\", \"sum\"")
    a = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals.float(), (n, n)).coalesce()
    return a.to_sparse_csr()


class _GCNConv(torch.nn.Module):
    """PyG's `GCNConv` parameters: `lin.weight`, then `bias` added after the aggregation."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin = torch.nn.Linear(in_dim, out_dim, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(out_dim))
        torch.nn.init.xavier_uniform_(self.lin.weight)


class _SAGEConv(torch.nn.Module):
    """PyG's `SAGEConv` parameters: `lin_l` on the neighbours' mean, `lin_r` on the node."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin_l = torch.nn.Linear(in_dim, out_dim)
        self.lin_r = torch.nn.Linear(in_dim, out_dim, bias=False)


class _GATConv(torch.nn.Module):
    """PyG's `GATConv` parameters (`lin`, `att_src`, `att_dst`, `bias`), self loops from `Â`'s
    structure, negative slope 0.2."""

    def __init__(self, in_dim: int, out_dim: int, heads: int, concat: bool, dropout: float):
        super().__init__()
        self.heads, self.out, self.concat, self.dropout = heads, out_dim, concat, dropout
        self.lin = torch.nn.Linear(in_dim, heads * out_dim, bias=False)
        self.att_src = torch.nn.Parameter(torch.empty(1, heads, out_dim))
        self.att_dst = torch.nn.Parameter(torch.empty(1, heads, out_dim))
        self.bias = torch.nn.Parameter(torch.zeros(heads * out_dim if concat else out_dim))
        for t in (self.lin.weight, self.att_src, self.att_dst):
            torch.nn.init.xavier_uniform_(t)

    def forward(self, x: torch.Tensor, adj: torch.Tensor, training: bool) -> torch.Tensor:
        n, heads = adj.shape[0], self.heads
        h = self.lin(x).view(-1, heads, self.out)
        a_src = (h * self.att_src).sum(-1)
        a_dst = (h[:n] * self.att_dst).sum(-1)
        crow, col = adj.crow_indices(), adj.col_indices()
        row = torch.repeat_interleave(torch.arange(n), crow.diff())
        e = torch.nn.functional.leaky_relu(a_src[col] + a_dst[row], 0.2)
        # the softmax over each row's entries (shifted by the row's largest: the same function)
        top = torch.full((n, heads), float("-inf")).scatter_reduce(
            0, row[:, None].expand(-1, heads), e.detach(), "amax")
        w = (e - top[row]).exp()
        alpha = w / torch.zeros(n, heads).index_add(0, row, w)[row]
        alpha = torch.nn.functional.dropout(alpha, self.dropout, training)
        out = torch.zeros(n, heads, self.out).index_add(0, row, alpha[..., None] * h[col])
        out = out.reshape(n, heads * self.out) if self.concat else out.mean(1)
        return out + self.bias


class _Stack(LayerwiseModel):
    """PyG's `BasicGNN` shape: `num_layers` convs, ReLU and dropout between them."""

    def __init__(self, conv, in_channels, hidden_channels, num_layers, out_channels, dropout):
        """`conv(l, in, out)` makes layer `l`'s conv."""
        super().__init__()
        self.dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        pairs = zip(self.dims, self.dims[1:])
        self.convs = torch.nn.ModuleList(conv(l, a, b) for l, (a, b) in enumerate(pairs))
        self.dropout = dropout

    def layer_dims(self):
        return self.dims

    def _finish(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        if layer + 1 == len(self.convs):
            return h
        return torch.nn.functional.dropout(torch.relu(h), self.dropout, self.training)


class GCN(_Stack):
    """PyG's `GCN` (`torch_geometric.nn.models.GCN`) as a `LayerwiseModel`: the same parameter
    names, so its `state_dict` loads into PyG's model and back."""

    adjacency = "gcn"

    def __init__(self, in_channels, hidden_channels, num_layers, out_channels, dropout=0.0):
        conv = lambda _, a, b: _GCNConv(a, b)  # noqa: E731
        super().__init__(conv, in_channels, hidden_channels, num_layers, out_channels, dropout)

    def forward_layer(self, layer, x, adj):
        conv = self.convs[layer]
        return self._finish(layer, adj @ conv.lin(x) + conv.bias)


class GAT(_Stack):
    """PyG's `GAT` (`torch_geometric.nn.models.GAT`: `hidden_channels` split over `heads` and
    concatenated, the last layer's heads averaged, attention dropout the model's `dropout`) as a
    `LayerwiseModel`, with its parameter names."""

    adjacency = "gcn"

    def __init__(self, in_channels, hidden_channels, num_layers, out_channels, dropout=0.0, heads=1):
        if hidden_channels % heads != 0:
            raise ValueError(f"hidden_channels {hidden_channels} is not divisible by heads {heads}")

        def conv(layer, a, b):
            hidden = layer + 1 < num_layers
            return _GATConv(a, b // heads if hidden else b, heads, hidden, dropout)

        super().__init__(conv, in_channels, hidden_channels, num_layers, out_channels, dropout)

    def forward_layer(self, layer, x, adj):
        return self._finish(layer, self.convs[layer](x, adj, self.training))


class GraphSAGE(_Stack):
    """PyG's `GraphSAGE` (mean aggregation) as a `LayerwiseModel`, with its parameter names."""

    adjacency = "mean"

    def __init__(self, in_channels, hidden_channels, num_layers, out_channels, dropout=0.0):
        conv = lambda _, a, b: _SAGEConv(a, b)  # noqa: E731
        super().__init__(conv, in_channels, hidden_channels, num_layers, out_channels, dropout)

    def forward_layer(self, layer, x, adj):
        conv = self.convs[layer]
        return self._finish(layer, conv.lin_l(adj @ x) + conv.lin_r(x[: adj.shape[0]]))


class _Driver:
    """What the engine calls for each layer and partition (`_grinnder._LayerwiseRun`)."""

    def __init__(self, model: LayerwiseModel, seed: int):
        self.model = model
        self.seed = seed
        self.epoch = 0
        self.adj: Dict[Any, torch.Tensor] = {}

    def set_adjacency(self, key, indptr, indices, values, shape):
        self.adj[key] = torch.sparse_csr_tensor(
            torch.from_numpy(indptr), torch.from_numpy(indices), torch.from_numpy(values), size=tuple(shape)
        )

    @contextlib.contextmanager
    def _rng(self, layer: int, key):
        # the same draws in a layer's forward and in its backward's recomputation
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(hash((self.seed, self.epoch, layer, key[0])) & 0x7FFF_FFFF_FFFF_FFFF)
            yield

    def forward(self, layer: int, key, x: np.ndarray):
        """The layer's output rows, and in training its autograd graph (the input and the
        output), which the engine hands back to `backward` where it keeps it for one."""
        if not self.model.training:
            with torch.no_grad(), self._rng(layer, key):
                y = self.model.forward_layer(layer, torch.from_numpy(x), self.adj[key])
            return _rows(y), None
        # (layer 0's input is the features: no gradient of them is asked for)
        xt = torch.from_numpy(x).requires_grad_(layer > 0)
        with torch.enable_grad(), self._rng(layer, key):
            y = self.model.forward_layer(layer, xt, self.adj[key])
        return _rows(y), (xt, y)

    def backward(self, layer: int, key, x: np.ndarray, dy: np.ndarray, need_dx: bool, tape=None):
        """Accumulates the parameters' gradients from the output's `dy`; the input's gradient
        where `need_dx`. `tape`: the graph `forward` made, else the layer runs again."""
        if tape is None:
            xt = torch.from_numpy(x).requires_grad_(need_dx)
            with torch.enable_grad(), self._rng(layer, key):
                y = self.model.forward_layer(layer, xt, self.adj[key])
        else:
            xt, y = tape
        if y.requires_grad:
            y.backward(torch.from_numpy(dy))
        if not need_dx:
            return None
        return _rows(xt.grad if xt.grad is not None else torch.zeros_like(xt))


def _rows(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().to(torch.float32).cpu().numpy())


class Trainer:
    """Trains a `LayerwiseModel` on a `grinnder.Dataset` through the tiered executor.

    `y`: the targets the criterion compares the output rows with (any dtype, `[N]` or `[N, T]`);
    by default the dataset's labels as int64. The train split is the dataset's. Keywords are
    `grinnder.Trainer`'s settings (`parts`, `host_mem`, `storage_dir`, `block_cache`, `seed`, …;
    the model's own settings, `model`, `hidden`, `dropout`, …, do not apply)."""

    def __init__(self, model: LayerwiseModel, dataset: "_grinnder.Dataset", *, y=None, **settings):
        if not isinstance(model, LayerwiseModel):
            raise TypeError("grinnder.torch.Trainer takes a grinnder.torch.LayerwiseModel")
        self.model = model
        self.dataset = dataset
        dims = [int(d) for d in model.layer_dims()]
        self._driver = _Driver(model, int(settings.get("seed", 0)))
        self._run = _grinnder._LayerwiseRun(dataset, self._driver, dims, model.adjacency, **settings)
        if y is None:
            y = torch.from_numpy(np.asarray(dataset.labels(), dtype=np.int64))
        self.y = torch.as_tensor(y)
        self.epoch = 0

    @property
    def parts(self) -> int:
        """The number of partitions."""
        return self._run.parts

    @property
    def storage_dir(self) -> Optional[str]:
        """The run's private storage directory (removed with the trainer), `None` without one."""
        d = self._run.storage_dir
        return None if d is None else str(d)

    def train_epoch(self, optimizer: torch.optim.Optimizer, criterion: Callable) -> Dict[str, float]:
        """One epoch: zeroes the gradients, runs the model forward and backward through the
        tiers with `criterion(output rows, y rows)` over the train split, then steps
        `optimizer`. Returns `{"epoch", "loss", "epoch_s"}`."""
        start = time.perf_counter()
        self.model.train()
        self._driver.epoch = self.epoch
        optimizer.zero_grad()

        def loss_of(ids: np.ndarray, rows: np.ndarray):
            out = torch.from_numpy(rows).requires_grad_(True)
            loss = criterion(out, self.y[torch.from_numpy(ids)])
            loss.backward()
            return float(loss.detach()), _rows(out.grad)

        loss = self._run.train_pass(self.epoch, loss_of)
        optimizer.step()
        self.epoch += 1
        return {"epoch": self.epoch - 1, "loss": loss, "epoch_s": time.perf_counter() - start}

    def predict(self) -> torch.Tensor:
        """Every node's output rows (the model in eval mode), `[N, out]`."""
        self.model.eval()
        return torch.from_numpy(self._run.predict())

    def embed(self, layer: int) -> torch.Tensor:
        """Every node's rows out of layer `layer` (from 0; the model in eval mode), through
        the same tiers: `[N, layer_dims()[layer + 1]]`."""
        self.model.eval()
        return torch.from_numpy(self._run.predict(layer + 1))
