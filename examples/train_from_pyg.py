"""Training from a PyG `Data`, as a PyG user has it (here Cora's arrays in a `Data`; with
`--planetoid ROOT`, PyG's own `Planetoid(ROOT, "Cora")[0]`, which downloads it).

    python examples/train_from_pyg.py [--planetoid ROOT]
"""

import argparse
import sys

import torch
from torch_geometric.data import Data

import grinnder


def bundled_cora() -> Data:
    """The project's copy of Cora as a PyG `Data`."""
    ds = grinnder.load_dataset("data/cora")
    n = ds.num_nodes
    mask = lambda split: torch.zeros(n, dtype=torch.bool).index_fill_(0, torch.from_numpy(ds.split(split)), True)
    return Data(x=torch.from_numpy(ds.features()), edge_index=torch.from_numpy(ds.edge_index()),
                y=torch.from_numpy(ds.labels()).long(), train_mask=mask("train"), val_mask=mask("valid"),
                test_mask=mask("test"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--planetoid", help="a folder for PyG's Planetoid Cora (downloaded)")
    args = p.parse_args()
    if args.planetoid:
        from torch_geometric.datasets import Planetoid
        from torch_geometric.transforms import NormalizeFeatures
        data = Planetoid(args.planetoid, "Cora", transform=NormalizeFeatures())[0]
    else:
        data = bundled_cora()
    ds = grinnder.Dataset.from_pyg(data, name="cora")
    print(ds, "(features read in place)" if ds.features_borrowed else "")
    trainer = grinnder.Trainer(ds, model="sage", hidden=64, epochs=100)
    summary = trainer.fit()
    print(f"test accuracy {summary['test_acc']:.4f} at the best validation epoch {summary['best_epoch']}")
    # the weights into a PyG model: the same names and shapes
    state = {k: torch.from_numpy(v) for k, v in trainer.state_dict("best").items()}
    print("tensors for load_state_dict:", sorted(state))


if __name__ == "__main__":
    sys.exit(main())
