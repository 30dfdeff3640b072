"""grinnder: full-graph GNN training on graphs whose activations and gradients do not fit in GPU
memory — layer by layer and partition by partition over a tiered store (GPU, host, storage),
with gradients exactly those of full-graph training.

    import grinnder
    ds = grinnder.load_dataset("data/cora")                  # or Dataset.from_arrays / from_pyg
    t = grinnder.Trainer(ds, model="gcn", hidden=16, epochs=200)
    t.fit()
    print(t.evaluate()["test_acc"])
    logits = t.predict()                                     # numpy [nodes, classes]

Settings are the `grinnder train` flags with `_` for `-` (`grinnder.settings()` lists them);
`help(grinnder.Trainer)` and the type stub document every call.
"""

from ._grinnder import Config, Dataset, Trainer, __version__, load_dataset, settings

__all__ = ["Config", "Dataset", "Trainer", "load_dataset", "settings", "__version__"]
