"""Predictions into numpy and pandas: per-node classes and probabilities, the test nodes'
accuracy, and embeddings for a downstream model.

    python examples/predictions_to_pandas.py [DATASET]
"""

import sys

import numpy as np

import grinnder


def main():
    ds = grinnder.load_dataset(sys.argv[1] if len(sys.argv) > 1 else "data/cora")
    t = grinnder.Trainer(ds, epochs=100)
    t.fit(progress=False)
    probs = t.predict(output="probs")                 # [nodes, classes] float32
    test = ds.split("test")
    predicted = probs[test].argmax(1)
    print("test accuracy", float((predicted == ds.labels()[test]).mean()))
    embedding = t.embed(0)                            # [nodes, hidden]: features for another model
    print("embedding", embedding.shape)
    try:
        import pandas as pd
    except ImportError:
        return
    frame = pd.DataFrame({"node": np.arange(ds.num_nodes), "class": probs.argmax(1),
                          "confidence": probs.max(1)})
    print(frame.sort_values("confidence").head())


if __name__ == "__main__":
    main()
