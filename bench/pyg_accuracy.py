#!/usr/bin/env python3
"""Test accuracy of a PyG model on a dataset in the npy exchange layout, for side-by-side
accuracy checks against `grinnder train` with the same settings (bench/gin_accuracy.sh).

The model is PyG's own: torch_geometric.nn.models.GIN / GCN / GraphSAGE / GAT (BasicGNN: conv,
then ReLU and dropout on hidden layers, no input dropout; GIN's MLP is [in, out, out]; GAT with
`--heads` heads of `--hidden` concatenated in hidden layers, averaged in the output layer, the
attention dropout `--dropout`, GATv2Conv with `--model gatv2`), or with `--model gcnii` PyG's
GCNII example model (examples/gcn2_cora.py: dropout on the input, before each GCN2Conv and
before the last Linear; `--alpha`, `--theta`; one weight decay for every parameter, as grinnder). Features are
row-normalised (NormalizeFeatures) unless --feature-norm none. Adam with L2 weight decay, full
batch, the reported test accuracy is the one at the epoch of best validation accuracy, as
grinnder reports it. Prints one JSON line per seed and a summary line.

Usage: pyg_accuracy.py DIR [--model gin] [--layers 2] [--hidden 64] [--dropout 0.5]
                       [--lr 0.01] [--weight-decay 5e-4] [--epochs 200] [--seeds 0,1,2]
                       [--eps 0.0] [--train-eps] [--heads 8] [--alpha 0.1] [--theta 0.5]
                       [--feature-norm row|none] [--device cpu]
"""
import argparse, json, statistics

import numpy as np
import torch
import torch.nn.functional as F


class Gcnii(torch.nn.Module):
    """PyG's examples/gcn2_cora.py model, its logits (cross entropy takes them)."""

    def __init__(self, in_dim, hidden, classes, layers, alpha, theta, dropout):
        super().__init__()
        from torch_geometric.nn import GCN2Conv
        self.lins = torch.nn.ModuleList([torch.nn.Linear(in_dim, hidden), torch.nn.Linear(hidden, classes)])
        self.convs = torch.nn.ModuleList([GCN2Conv(hidden, alpha, theta, l + 1) for l in range(layers)])
        self.dropout = dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, self.dropout, training=self.training)
        x = x0 = self.lins[0](x).relu()
        for conv in self.convs:
            x = F.dropout(x, self.dropout, training=self.training)
            x = conv(x, x0, edge_index).relu()
        x = F.dropout(x, self.dropout, training=self.training)
        return self.lins[1](x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--model", default="gin", choices=["gin", "gcn", "sage", "gat", "gatv2", "gcnii"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--eps", type=float, default=0.0)
    ap.add_argument("--train-eps", action="store_true")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--theta", type=float, default=0.5)
    ap.add_argument("--feature-norm", default="row", choices=["row", "none"])
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    from torch_geometric.nn.models import GAT, GIN, GCN, GraphSAGE

    dev = torch.device(a.device)
    ei = torch.from_numpy(np.load(f"{a.dir}/edge_index.npy")).to(dev)
    x = torch.from_numpy(np.load(f"{a.dir}/node_feat.npy")).to(dev)
    if a.feature_norm == "row":
        x = x - x.min()
        x = x / x.sum(dim=1, keepdim=True).clamp(min=1.0)
    y = torch.from_numpy(np.load(f"{a.dir}/node_label.npy")).to(dev)
    split = {s: torch.from_numpy(np.load(f"{a.dir}/{s}_idx.npy")).to(dev) for s in ("train", "valid", "test")}
    c = int(y.max()) + 1
    accs = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        torch.manual_seed(seed)
        kw = dict(in_channels=x.shape[1], hidden_channels=a.hidden, num_layers=a.layers, out_channels=c,
                  dropout=a.dropout)
        if a.model == "gin":
            model = GIN(eps=a.eps, train_eps=a.train_eps, **kw)
        elif a.model == "gcn":
            model = GCN(**kw)
        elif a.model == "gcnii":
            model = Gcnii(x.shape[1], a.hidden, c, a.layers, a.alpha, a.theta, a.dropout)
        elif a.model in ("gat", "gatv2"):
            # hidden_channels is the concatenated width: heads of --hidden each
            model = GAT(**{**kw, "hidden_channels": a.hidden * a.heads}, heads=a.heads, v2=a.model == "gatv2")
        else:
            model = GraphSAGE(**kw)
        model = model.to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        best = (-1.0, 0.0, -1)
        for epoch in range(a.epochs):
            model.train()
            opt.zero_grad()
            out = model(x, ei)
            loss = F.cross_entropy(out[split["train"]], y[split["train"]])
            loss.backward()
            opt.step()
            model.eval()
            with torch.no_grad():
                pred = model(x, ei).argmax(dim=1)
                acc = {s: (pred[i] == y[i]).float().mean().item() for s, i in split.items()}
            if acc["valid"] > best[0]:
                best = (acc["valid"], acc["test"], epoch)
        accs.append(best[1])
        print(json.dumps({"seed": seed, "best_valid_acc": best[0], "test_acc": best[1], "best_epoch": best[2]}))
    print(json.dumps({"model": a.model, "mean_test_acc": statistics.mean(accs),
                      "stdev": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                      "torch": torch.__version__, "pyg": __import__("torch_geometric").__version__}))


if __name__ == "__main__":
    main()
