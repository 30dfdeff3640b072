"""grinnder.torch: a PyTorch model of the caller's, trained through the tiered executor with
the caller's optimizer and criterion, gives plain whole-graph PyTorch training's per-epoch
losses and final parameters from the same initial weights.

Tolerance: f32 reassociation (a partition sums its rows' products in another order than the
whole graph does): losses within 1e-5 relative, each gradient and each parameter within 1e-5 of
its largest magnitude. Final parameters are compared under SGD; under Adam the losses and the
gradients are, not the parameters: Adam's step `m / (√v + ε)` is the same whatever a gradient's
size, so an element whose gradient is near ε (1e-8) moves by up to the learning rate on noise
of f32 reassociation (measured: the gradients agree to 6.4e-7 of their scale, Adam's final
parameters to 1.1e-4).
"""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import grinnder  # noqa: E402
from grinnder.torch import GAT, GCN, GraphSAGE, LayerwiseModel, Trainer, adjacency  # noqa: E402

TOL = 1e-5


class GatedResidual(LayerwiseModel):
    """A gated residual graph convolution with LayerNorm, which none of the built-in families
    expresses: `g ⊙ Â x W + (1 − g) ⊙ x_own R`, `g = σ(x_own G)`, then LayerNorm and ReLU in
    hidden layers. It reads its own rows as the first rows of `x`."""

    def __init__(self, dims):
        super().__init__()
        self.dims = list(dims)
        pairs = list(zip(self.dims, self.dims[1:]))
        self.lins = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in pairs)
        self.gates = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in pairs)
        self.res = torch.nn.ModuleList(torch.nn.Linear(a, b, bias=False) for a, b in pairs)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(b) for b in self.dims[1:-1])

    def layer_dims(self):
        return self.dims

    def forward_layer(self, layer, x, adj):
        own = x[: adj.shape[0]]
        g = torch.sigmoid(self.gates[layer](own))
        h = g * (adj @ self.lins[layer](x)) + (1 - g) * self.res[layer](own)
        if layer + 1 < len(self.lins):
            h = torch.relu(self.norms[layer](h))
        return h


@pytest.fixture(scope="module")
def data(cora):
    ds = grinnder.Dataset.from_arrays(
        cora["edge_index"], cora["x"], cora["y"], cora["train"], cora["valid"], cora["test"]
    )
    return ds


def whole_graph(model, ds, y, criterion, opt_of, epochs, sched_of=None):
    """Plain PyTorch: the whole graph's forward, the criterion over the train split."""
    a = adjacency(ds)
    x = torch.from_numpy(np.asarray(ds.features()))
    train = torch.from_numpy(np.asarray(ds.split("train"), dtype=np.int64))
    opt = opt_of(model)
    sched = sched_of(opt) if sched_of else None
    losses = []
    for _ in range(epochs):
        opt.zero_grad()
        loss = criterion(model(x, a)[train], y[train])
        loss.backward()
        opt.step()
        if sched:
            sched.step()
        losses.append(loss.item())
    return losses


def tiered(model, ds, y, criterion, opt_of, epochs, tmp_path, sched_of=None, **settings):
    tmp_path.mkdir(parents=True, exist_ok=True)
    t = Trainer(model, ds, y=y, parts=4, storage_dir=str(tmp_path), block_cache="0", **settings)
    assert t.parts == 4
    opt = opt_of(model)
    sched = sched_of(opt) if sched_of else None
    losses = []
    for _ in range(epochs):
        losses.append(t.train_epoch(opt, criterion)["loss"])
        if sched:
            sched.step()
    return losses, t


def assert_same_params(ref_model, model):
    for (name, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        scale = q.detach().abs().max().item()
        err = (p.detach() - q.detach()).abs().max().item()
        assert err <= TOL * scale, f"{name} off by {err:.3e} (its scale {scale:.3e})"


class Unstepped:
    """An optimizer that leaves the parameters and their gradients as a pass made them."""

    def __init__(self, model):
        self.model = model

    def zero_grad(self):
        self.model.zero_grad()

    def step(self):
        pass


def assert_same_gradients(ds, model, y, criterion, tmp_path):
    ref = copy.deepcopy(model)
    whole_graph(ref, ds, y, criterion, Unstepped, 1)
    tiered(model, ds, y, criterion, Unstepped, 1, tmp_path)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        scale = q.grad.abs().max().item()
        err = (p.grad - q.grad).abs().max().item()
        assert scale > 0, f"{name} has no gradient"
        assert err <= TOL * scale, f"{name}'s gradient off by {err:.3e} (its scale {scale:.3e})"


def run_both(ds, dims, y, criterion, opt_of, tmp_path, sched_of=None, params=True):
    torch.manual_seed(0)
    model = GatedResidual(dims)
    assert_same_gradients(ds, copy.deepcopy(model), y, criterion, tmp_path / "gradients")
    ref = copy.deepcopy(model)
    want = whole_graph(ref, ds, y, criterion, opt_of, 5, sched_of)
    got, t = tiered(model, ds, y, criterion, opt_of, 5, tmp_path, sched_of)
    assert np.allclose(got, want, rtol=TOL, atol=0), f"losses {got} vs {want}"
    if params:
        assert_same_params(ref, model)
    assert got[-1] < got[0], f"the loss did not fall: {got}"
    return t, model, ref


def test_a_custom_model_trains_as_whole_graph_pytorch_with_every_block_in_storage(data, tmp_path):
    y = torch.from_numpy(np.asarray(data.labels(), dtype=np.int64))
    adam = lambda m: torch.optim.Adam(m.parameters(), lr=0.01)
    t, model, ref = run_both(data, [data.num_features, 32, 16, data.num_classes], y,
                             torch.nn.CrossEntropyLoss(), adam, tmp_path, params=False)
    # every block went through files in the run's own directory
    reads, writes = t._run.storage_ops
    assert reads > 0 and writes > 0
    # predict: every node's output rows, the whole graph's forward in eval mode
    ref.eval()
    want = ref(torch.from_numpy(np.asarray(data.features())), adjacency(data)).detach()
    got = t.predict()
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= TOL * want.abs().max().item()
    # a hidden layer's rows: the whole graph's first layer, in eval mode
    want = ref.forward_layer(0, torch.from_numpy(np.asarray(data.features())), adjacency(data)).detach()
    got = t.embed(0)
    assert got.shape == (data.num_nodes, 32)
    assert (got - want).abs().max().item() <= TOL * want.abs().max().item()
    with pytest.raises(ValueError, match="layers 0 to 2"):
        t.embed(3)


def test_weighted_cross_entropy_and_a_step_schedule(data, tmp_path):
    y = torch.from_numpy(np.asarray(data.labels(), dtype=np.int64))
    weight = torch.linspace(0.5, 2.0, data.num_classes)
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
    step = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)
    run_both(data, [data.num_features, 32, data.num_classes], y,
             torch.nn.CrossEntropyLoss(weight=weight), sgd, tmp_path, sched_of=step)


def test_multi_label_targets_with_bce(data, tmp_path):
    g = torch.Generator().manual_seed(1)
    y = (torch.rand(data.num_nodes, 5, generator=g) < 0.3).float()
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.5)
    run_both(data, [data.num_features, 32, 5], y, torch.nn.BCEWithLogitsLoss(), sgd, tmp_path)


def test_regression_targets_with_mse(data, tmp_path):
    g = torch.Generator().manual_seed(2)
    y = torch.randn(data.num_nodes, 3, generator=g)
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1)
    run_both(data, [data.num_features, 16, 3], y, torch.nn.MSELoss(), sgd, tmp_path)


def test_an_exception_in_forward_layer_is_raised_by_train_epoch(data, tmp_path):
    class Broken(GatedResidual):
        def forward_layer(self, layer, x, adj):
            if layer == 1:
                raise KeyError("layer one is broken")
            return super().forward_layer(layer, x, adj)

    t = Trainer(Broken([data.num_features, 8, data.num_classes]), data, parts=2)
    opt = torch.optim.SGD(t.model.parameters(), lr=0.1)
    with pytest.raises(KeyError, match="layer one is broken"):
        t.train_epoch(opt, torch.nn.CrossEntropyLoss())


def test_a_model_whose_widths_do_not_match_the_features_is_refused(data):
    with pytest.raises(ValueError, match="features"):
        Trainer(GatedResidual([data.num_features + 1, 8, 7]), data)


@pytest.mark.parametrize("name,kw", [("GCN", {}), ("GraphSAGE", {}), ("GAT", {"heads": 4})])
def test_the_built_in_models_are_pygs_and_train_as_whole_graph_pytorch(data, tmp_path, name, kw):
    pyg = pytest.importorskip("torch_geometric.nn.models")
    torch.manual_seed(0)
    model = {"GCN": GCN, "GraphSAGE": GraphSAGE, "GAT": GAT}[name]
    mine = model(data.num_features, 16, 2, data.num_classes, **kw)
    y = torch.from_numpy(np.asarray(data.labels(), dtype=np.int64))
    ref = copy.deepcopy(mine)
    adam = lambda m: torch.optim.Adam(m.parameters(), lr=0.01)
    x = torch.from_numpy(np.asarray(data.features()))
    train = torch.from_numpy(np.asarray(data.split("train"), dtype=np.int64))
    opt, want = adam(ref), []
    a = adjacency(data, mine.adjacency)
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ref(x, a)[train], y[train])
        loss.backward()
        opt.step()
        want.append(loss.item())
    got, t = tiered(mine, data, y, torch.nn.CrossEntropyLoss(), adam, 3, tmp_path)
    got = got[:3]
    assert np.allclose(got, want, rtol=TOL, atol=0), f"losses {got} vs {want}"
    # PyG's model of the same name takes the state dict as it is and computes the same logits
    theirs = getattr(pyg, name)(data.num_features, 16, 2, data.num_classes, **kw)
    theirs.load_state_dict(mine.state_dict())
    theirs.eval()
    ei = torch.from_numpy(np.asarray(data.edge_index(), dtype=np.int64))
    logits = theirs(x, ei).detach()
    got = t.predict()
    assert (got - logits).abs().max().item() <= TOL * logits.abs().max().item()


def test_an_adjacency_a_model_cannot_have_is_refused(data):
    class Odd(GatedResidual):
        adjacency = "max"

    with pytest.raises(ValueError, match="one of"):
        Trainer(Odd([data.num_features, 8, 7]), data)


def test_an_exception_in_the_criterion_is_raised_and_training_goes_on(data):
    t = Trainer(GatedResidual([data.num_features, 8, data.num_classes]), data, parts=2)
    opt = torch.optim.SGD(t.model.parameters(), lr=0.1)

    def broken(out, y):
        raise ArithmeticError("no loss today")

    with pytest.raises(ArithmeticError, match="no loss today"):
        t.train_epoch(opt, broken)
    assert t.train_epoch(opt, torch.nn.CrossEntropyLoss())["loss"] > 0
