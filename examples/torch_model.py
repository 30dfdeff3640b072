"""GriNNder's programmatic example, written for grinnder: your PyTorch model given layer by
layer (`layer_dims`, `forward_layer`), trained through the tiered executor — 4 partitions,
every block through the storage tier — with your optimizer and your loss.

    python examples/torch_model.py [data/cora] [--epochs 100] [--parts 4]
"""

import argparse
import tempfile

import numpy as np
import torch

import grinnder
from grinnder.torch import LayerwiseModel, Trainer


class GCN(LayerwiseModel):
    """A two-layer GCN with dropout, layer by layer: `x` holds a partition's own rows, then
    its halo; `adj` is the whole graph's normalised adjacency, the partition's rows by `x`'s."""

    def __init__(self, in_dim, hidden, classes, dropout=0.5):
        super().__init__()
        self.dims = [in_dim, hidden, classes]
        self.lins = torch.nn.ModuleList([torch.nn.Linear(in_dim, hidden), torch.nn.Linear(hidden, classes)])
        self.dropout = dropout

    def layer_dims(self):
        return self.dims

    def forward_layer(self, layer, x, adj):
        x = torch.nn.functional.dropout(x, self.dropout, self.training)
        h = adj @ self.lins[layer](x)
        return torch.relu(h) if layer == 0 else h


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data", nargs="?", default="data/cora")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--parts", type=int, default=4)
    a = p.parse_args()
    torch.manual_seed(0)
    ds = grinnder.load_dataset(a.data)
    model = GCN(ds.num_features, 16, ds.num_classes)
    with tempfile.TemporaryDirectory() as blocks:
        trainer = Trainer(model, ds, parts=a.parts, storage_dir=blocks, block_cache="0")
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
        criterion = torch.nn.CrossEntropyLoss()
        for epoch in range(a.epochs):
            figures = trainer.train_epoch(optimizer, criterion)
            if epoch % 10 == 0 or epoch + 1 == a.epochs:
                print(f"epoch {epoch}: loss {figures['loss']:.4f}, {figures['epoch_s']:.3f} s")
        pred = trainer.predict().argmax(1).numpy()
    labels = np.asarray(ds.labels())
    test = np.asarray(ds.split("test"))
    print(f"test accuracy {(pred[test] == labels[test]).mean():.3f}")


if __name__ == "__main__":
    main()
