#!/usr/bin/env python3
"""Mini-batch GraphSAGE with PyTorch Geometric's NeighborLoader: the baseline beside
`grinnder train --mode minibatch` (bench/gpu_minibatch.sh runs both in one call).

Reads the npy exchange layout (`grinnder export --format npy`; see docs/datasets.md):
edge_index.npy, node_feat.npy, node_label.npy, train_idx.npy. Trains SAGEConv (mean, root
weight) layers with ReLU between them, Adam, as PyG's GraphSAGE examples do: NeighborLoader
with `num_workers` sampling processes and `pin_memory`, each batch moved with
`non_blocking=True`, the loss on the batch's seed rows. The features stay in host memory (the
loader gathers each batch's rows on its workers: PyG's conventional copy path).

Prints one JSON object on the last line: seconds of every epoch, the median, seeds per second,
the loss, peak GPU memory; or {"error": ...} when PyG cannot sample here (it needs pyg-lib or
torch-sparse for neighbour sampling).
Usage: pyg_minibatch.py DIR [--layers 3] [--hidden 256] [--fanout 15,10,5] [--batch-size 1024]
                        [--epochs 2] [--workers 8] [--max-batches N] [--lr 0.01]
"""
import argparse, json, sys, time

import numpy as np
import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--fanout", default="15,10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--max-batches", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.01)
    a = ap.parse_args()
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn import SAGEConv

    dev = torch.device("cuda")
    t0 = time.perf_counter()
    ei = torch.from_numpy(np.load(f"{a.dir}/edge_index.npy"))
    x = torch.from_numpy(np.load(f"{a.dir}/node_feat.npy"))
    y = torch.from_numpy(np.load(f"{a.dir}/node_label.npy"))
    train = torch.from_numpy(np.load(f"{a.dir}/train_idx.npy"))
    n, f = x.shape
    c = int(y.max()) + 1
    data = Data(x=x, y=y, edge_index=ei, num_nodes=n)
    fanout = [int(v) for v in a.fanout.split(",")]
    assert len(fanout) == a.layers, "one fanout per layer"
    try:
        loader = NeighborLoader(data, num_neighbors=fanout, batch_size=a.batch_size, input_nodes=train,
                                shuffle=True, num_workers=a.workers, pin_memory=True,
                                persistent_workers=a.workers > 0)
    except ImportError as e:
        print(json.dumps(dict(system="pyg", error="no neighbour sampler", detail=str(e)[:300])))
        return 0
    load_s = time.perf_counter() - t0

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            dims = [f] + [a.hidden] * (a.layers - 1) + [c]
            self.convs = torch.nn.ModuleList(SAGEConv(dims[i], dims[i + 1]) for i in range(a.layers))

        def forward(self, h, edge_index):
            for i, conv in enumerate(self.convs):
                h = conv(h, edge_index)
                if i < len(self.convs) - 1:
                    h = F.relu(h)
            return h

    torch.manual_seed(0)
    model = Net().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    torch.cuda.reset_peak_memory_stats()
    times, seeds = [], 0
    for _ in range(a.epochs):
        torch.cuda.synchronize()
        s = time.perf_counter()
        seeds = 0
        for k, batch in enumerate(loader):
            if a.max_batches and k == a.max_batches:
                break
            batch = batch.to(dev, non_blocking=True)
            opt.zero_grad()
            out = model(batch.x, batch.edge_index)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            opt.step()
            seeds += batch.batch_size
        torch.cuda.synchronize()
        times.append(time.perf_counter() - s)
    t = sorted(times)
    print(json.dumps(dict(system="pyg", model="sage", layers=a.layers, hidden=a.hidden, fanout=fanout,
                          batch_size=a.batch_size, workers=a.workers, nodes=n, feat=f, load_s=round(load_s, 3),
                          epoch_s=times, epoch_s_median=t[len(t) // 2], seeds_per_s=seeds / t[len(t) // 2],
                          loss=float(loss), peak_gib=torch.cuda.max_memory_allocated() / 2**30)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
