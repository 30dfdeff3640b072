#!/usr/bin/env python3
"""Reference timings: full-graph training of the same model on the same graph with PyTorch Geometric.

Reads a dataset in the npy exchange layout (`grinnder export --format npy`, or
`grinnder generate --format npy`; docs/datasets.md):
  DIR/edge_index.npy   int64 [2, E]  every directed edge that message passing uses
                                     (already symmetrised, no self loops, no duplicates)
  DIR/node_feat.npy    float32 [N, F]
  DIR/node_label.npy   int64 [N]
  DIR/train_idx.npy, DIR/valid_idx.npy, DIR/test_idx.npy   int64 node ids

Prints one JSON object on the last line: epoch time median/min (s), peak device memory (GiB),
final loss and accuracies, or {"error": "oom"} when the device runs out of memory.
Usage: pyg_baseline.py DIR --model gcn|sage|gat|gatv2 [--layers 2] [--hidden 256] [--heads 1]
                       [--epochs 5] [--device cuda|cpu] [--lr 0.01] [--norm none|layer]
                       [--dropout 0.0] [--weight-decay 0.0] [--threads N]
"""
import argparse, json, sys, time

import numpy as np
import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--model", default="gcn", choices=["gcn", "sage", "gat", "gatv2"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--norm", default="none", choices=["none", "layer"])
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from torch_geometric.nn import GATConv, GATv2Conv, GCNConv, SAGEConv
    from torch_geometric.utils import to_torch_csr_tensor

    dev = torch.device(a.device)
    t0 = time.perf_counter()
    ei = torch.from_numpy(np.load(f"{a.dir}/edge_index.npy")).to(dev)
    x = torch.from_numpy(np.load(f"{a.dir}/node_feat.npy", mmap_mode="r")[:]).to(dev)
    y = torch.from_numpy(np.load(f"{a.dir}/node_label.npy")).to(dev)
    split = {s: torch.from_numpy(np.load(f"{a.dir}/{s}_idx.npy")).to(dev) for s in ("train", "valid", "test")}
    n, f = x.shape
    c = int(y.max()) + 1
    # GCN and SAGE run on the sparse CSR path (PyG's fastest full-graph path); GAT(v2) needs edge_index.
    attention = a.model in ("gat", "gatv2")
    adj = ei if attention else to_torch_csr_tensor(ei.flip(0), size=(n, n))
    load_s = time.perf_counter() - t0

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            dims = [f] + [a.hidden] * (a.layers - 1) + [c]
            self.convs = torch.nn.ModuleList()
            self.norms = torch.nn.ModuleList()
            for i in range(a.layers):
                last = i == a.layers - 1
                if a.model == "gcn":
                    conv = GCNConv(dims[i], dims[i + 1], cached=True)
                elif a.model == "sage":
                    conv = SAGEConv(dims[i], dims[i + 1])
                else:
                    heads = 1 if last else a.heads
                    cls = GATConv if a.model == "gat" else GATv2Conv
                    conv = cls(dims[i] if i == 0 else dims[i] * a.heads, dims[i + 1], heads=heads)
                self.convs.append(conv)
                if not last and a.norm == "layer":
                    self.norms.append(torch.nn.LayerNorm(dims[i + 1] * (a.heads if attention else 1)))

        def forward(self, h):
            for i, conv in enumerate(self.convs):
                h = conv(h, adj)
                if i < len(self.convs) - 1:
                    if self.norms:
                        h = self.norms[i](h)
                    h = F.relu(h)
                    h = F.dropout(h, p=a.dropout, training=self.training)
            return h

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    try:
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(0)
        model = Net().to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        times = []
        for _ in range(a.epochs + 1):  # the first epoch is a warm-up
            sync()
            s = time.perf_counter()
            model.train()
            opt.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out[split["train"]], y[split["train"]])
            loss.backward()
            opt.step()
            sync()
            times.append(time.perf_counter() - s)
        model.eval()
        with torch.no_grad():
            pred = model(x).argmax(1)
        acc = {s: float((pred[i] == y[i]).float().mean()) for s, i in split.items()}
        t = sorted(times[1:])
        res = dict(system="pyg", model=a.model, layers=a.layers, hidden=a.hidden, heads=a.heads,
                   nodes=n, edges=int(ei.shape[1]), feat=f, classes=c, device=str(dev),
                   load_s=round(load_s, 3), epoch_s_median=t[len(t) // 2], epoch_s_min=t[0],
                   peak_gib=(torch.cuda.max_memory_allocated() / 2**30) if dev.type == "cuda" else None,
                   loss=float(loss), train_acc=acc["train"], valid_acc=acc["valid"], test_acc=acc["test"])
    except torch.OutOfMemoryError as e:
        res = dict(system="pyg", model=a.model, error="oom", detail=str(e)[:200])
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
