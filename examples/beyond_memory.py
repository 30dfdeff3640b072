"""A run under budgets: the host budget of the whole process (`host_mem`), blocks spilling to a
storage directory, and with a GPU its memory budget (`gpu_mem`). A budget below what the run
needs is refused before training, naming the least that would do.

    python examples/beyond_memory.py DATASET --host-mem 8GiB --storage-dir /nvme/tmp [--gpu-mem 24GiB] [--out logits.npy]
"""

import argparse

import grinnder


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("--host-mem", default="8GiB")
    p.add_argument("--storage-dir", required=True)
    p.add_argument("--gpu-mem")
    p.add_argument("--parts", type=int, default=16)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", default="logits.npy", help="where the predicted logits go")
    a = p.parse_args()
    ds = grinnder.load_dataset(a.dataset)
    settings = dict(model="gcn", hidden=256, dropout=0.0, input_dropout=0.0, feature_norm="none",
                    epochs=a.epochs, parts=a.parts, host_mem=a.host_mem, storage_dir=a.storage_dir)
    if a.gpu_mem:
        settings.update(device="cuda", gpu_mem=a.gpu_mem)
    try:
        trainer = grinnder.Trainer(ds, **settings)
    except ValueError as e:          # e.g. "--host-mem ... is too small ... needs at least N MiB"
        raise SystemExit(f"refused: {e}")
    for _ in range(a.epochs):
        m = trainer.train_epoch()
        print(f"epoch {m['epoch']}: {m['epoch_s']:.2f} s, loss {m['loss']:.4f}, "
              f"storage read {m['storage_read_bytes'] / 2**30:.2f} GiB written {m['storage_write_bytes'] / 2**30:.2f} GiB, "
              f"peak host {m['peak_host_bytes'] / 2**30:.2f} GiB")
    # predictions larger than memory go straight to a file, row-block by row-block
    print("logits written to", trainer.predict(out=a.out))


if __name__ == "__main__":
    main()
