"""GriNNder's programmatic example, written for grinnder: load a graph, configure partitions and a
host budget with a storage directory, build the trainer, loop over epochs, evaluate, predict.

    python examples/train_partitioned.py [DATASET] [--epochs 20]

DATASET is anything `grinnder train` reads (default: the bundled Cora). The blocks beyond the
host budget go to a private directory inside the storage directory, removed at the end.
"""

import argparse
import tempfile

import grinnder


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dataset", nargs="?", default="data/cora")
    p.add_argument("--epochs", type=int, default=20)
    args = p.parse_args()

    dataset = grinnder.load_dataset(args.dataset)
    print(dataset)
    with tempfile.TemporaryDirectory() as storage:
        config = grinnder.Config(
            model="gcn", layers=2, hidden=16, dropout=0.0, epochs=args.epochs,
            parts=4,                   # layer by layer, partition by partition
            block_cache=0,             # every block through the storage tier (a tiny host budget)
            storage_dir=storage,
        )
        trainer = grinnder.Trainer(dataset, config)
        for _ in range(args.epochs):
            m = trainer.train_epoch()
            print(f"epoch {m['epoch']:3d}  loss {m['loss']:.4f}  valid {m['valid_acc']:.4f}  "
                  f"storage read {m['storage_read_bytes'] / 2**20:.1f} MiB")
        print("test accuracy", trainer.evaluate()["test_acc"])
        logits = trainer.predict()
        print("logits", logits.shape)


if __name__ == "__main__":
    main()
